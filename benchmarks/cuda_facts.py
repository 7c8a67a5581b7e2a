"""This GPU's facts as tests/data/cuda_facts.json records them, read on a GPU machine:
the fields of ``torch.cuda.get_device_properties`` gatekeeper reads, the driver
(nvidia-smi), torch's build and CUDA runtime, Triton and Python, then gatekeeper's own
``env_facts("cuda")`` and the env key a bundle compiled there is stored under.

    python benchmarks/cuda_facts.py > facts.json      (exit 2 without a CUDA GPU)
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys


def main() -> None:
    import torch

    if not torch.cuda.is_available():
        print("cuda_facts: no CUDA GPU here", file=sys.stderr)
        sys.exit(2)
    from gatekeeper.key import env_facts, env_key

    props = torch.cuda.get_device_properties(0)
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    facts = env_facts("cuda")
    gpu = {
        "name": props.name,
        "major": props.major,
        "minor": props.minor,
        "total_memory_mib": props.total_memory >> 20,
        "multi_processor_count": props.multi_processor_count,
        "driver": smi.stdout.strip() or None,
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "triton": facts.get("triton"),
        "arch": platform.machine(),
    }
    bare = {k: v for k, v in facts.items() if k != "compile_env"}
    doc = {"gpu": gpu, "env_facts": facts, "env_key": env_key(facts), "env_key_bare": env_key(bare)}
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
