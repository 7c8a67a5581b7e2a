#!/usr/bin/env bash
# The open issues' GPU parts in one device call, each in a time box, figures into OUT:
# this GPU's facts as tests/data/cuda_facts.json records them (benchmarks/cuda_facts.py),
# issue 50's 8B-shaped bf16 Llama generating with reduce-overhead (decode tokens/s, the
# bandwidth fraction, cold vs warm: benchmarks/generate.py, docs/generation.md), int8 and
# float8 variants on CUDA (benchmarks/quantization.py, docs/quantization.md) and, when
# SCALE_S is set, an 8B-shaped bf16 Llama checked and paired (benchmarks/scale.py,
# docs/scale.md). Run in the repository root on the GPU machine with its own python3,
# .whl carried (made here by `bash benchmarks/gpu_wheels.sh` plus torchao's wheel):
#
#   bash benchmarks/gpu_issues.sh    (GEN_S, QUANT_S, SCALE_S: the time boxes, seconds)
set -u
out=${OUT:-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl || exit 3
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 3
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
python3 benchmarks/cuda_facts.py >"$out/cuda_facts.json" 2>"$out/cuda_facts.err"
sweep() { pkill -f -- "-m gatekeeper" ; sleep 1; }  # a timed-out part's workers
timeout "${GEN_S:-330}" python3 benchmarks/generate.py --size 8b --dtype bf16 --device cuda \
  --mode reduce-overhead --min-time 1 --json "$out/generate8b.json" \
  >"$out/generate8b.md" 2>"$out/generate8b.err"
echo "generate 8b: exit $?"; sweep
if [ "${SCALE_S:-0}" -gt 0 ]; then
  timeout "$SCALE_S" python3 benchmarks/scale.py --size 8b --dtype bf16 --device cuda \
    --stages build,compile,check,paired --json "$out/scale8b.json" \
    >"$out/scale8b.md" 2>"$out/scale8b.err"
  echo "scale 8b: exit $?"; sweep
fi
timeout "${QUANT_S:-170}" python3 benchmarks/quantization.py --device cuda --min-time 1 \
  --configs none,int8-weight-only,int8-dynamic,float8-dynamic \
  --json "$out/quant.json" >"$out/quant.md" 2>"$out/quant.err"
echo "quantization: exit $?"; sweep
tail -n 5 "$out"/*.err
