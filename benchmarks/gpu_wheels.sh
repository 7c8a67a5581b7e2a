#!/usr/bin/env bash
# The wheels of gatekeeper's dependencies that a GPU machine's image lacks (it has torch,
# numpy, scipy, tabulate, requests and the like, and no registry to fetch the rest from),
# for its python3 (CPython 3.12, x86-64 Linux): the versions and hashes pinned in
# requirements/pinned.txt, downloaded here into OUT (default .whl, which git ignores once
# `echo /.whl/ >> .git/info/exclude` ran). Then, on the GPU machine, in the repository
# root, with the image's own python3 and torch:
#
#   python3 -m pip install -q --no-index --no-deps .whl/*.whl
#   python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .
#
# (docs/gpu.md has the whole device command.) Usage: bash benchmarks/gpu_wheels.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.whl}
python=${PYTHON:-python3}
# what gatekeeper imports that the image has no wheel of, and what those need (pydantic
# needs a newer typing-extensions than an image may hold)
names=(
  annotated-types boto3 botocore cffi cryptography github-action-utils jmespath
  pycparser pydantic pydantic-core pygithub pyjwt pynacl s3transfer typing-extensions
  typing-inspection zstandard
)
req=$(mktemp)
trap 'rm -f "$req"' EXIT
# each name's pin with its hash lines, from requirements/pinned.txt
"$python" - "$req" "${names[@]}" <<'EOF'
import re, sys
out, names = sys.argv[1], set(sys.argv[2:])
keep, lines = False, []
for line in open("requirements/pinned.txt"):
    if line.strip() and not line.startswith((" ", "#")):
        keep = re.split(r"[=<> ]", line, maxsplit=1)[0].lower() in names
    if keep:
        lines.append(line)
found = {re.split(r"[=<> ]", ln, maxsplit=1)[0].lower() for ln in lines if not ln.startswith(" ")}
missing = names - found
if missing:
    sys.exit(f"gpu_wheels: not pinned in requirements/pinned.txt: {', '.join(sorted(missing))}")
open(out, "w").writelines(lines)
EOF
mkdir -p "$out"
"$python" -m pip download --quiet --no-deps --only-binary=:all: --require-hashes \
  --python-version 3.12 --implementation cp \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -r "$req" -d "$out"
# torchao for the quantized variants (the quant extra, not pinned): 0.17.0 ran on the
# image's torch 2.11.0+cu130 (docs/quantization.md, "On a GPU")
"$python" -m pip download --quiet --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
  "torchao==${TORCHAO:-0.17.0}" -d "$out"
ls "$out"/*.whl | wc -l | xargs printf '%s wheels in '"$out"' ('
du -sh "$out" | cut -f1 | xargs printf '%s)\n'
