"""``python -m gatekeeper.worker.headers FOLDER``: build inductor's precompiled C++
headers into FOLDER, running no model code (docs/configuration.md, "Shared precompiled
headers"). The parent starts it, in a box whose only writable places are FOLDER and its
own scratch, before the first model worker of a machine, torch and compiler; model
workers see FOLDER read-only and link its headers into their own temp dir.

Inductor names a header by its compiler's version, its flags and a hash of what it
includes, so what this builds serves exactly the kernels that would build the same one
(every CPU kernel of a torch build on a machine, measured: elementwise, reductions,
matmul epilogues, integer indexing, fp32 and bf16 all ask for one header); a kernel that
asks for another finds none here and its worker builds its own, as without a folder.
"""

from __future__ import annotations

import os
import shutil
import sys

ISA_PART = "isa.part"  # where the ISA check goes; the parent names it for its key


def use_folder(folder: str) -> None:
    """Point this process's inductor at ``folder`` for its precompiled headers (and
    their locks); torch reads the place once, when it is imported."""
    from torch._inductor import codecache

    codecache._HEADER_DIR = folder
    codecache._HEADER_LOCK_DIR = os.path.join(folder, "locks")


def build(folder: str) -> int:
    """Compile one small function on the CPU with the header folder pointed at
    ``folder``; the number of headers it then holds."""
    import torch
    from torch._inductor import codecache, config

    if not hasattr(codecache, "_HEADER_DIR"):  # a torch without precompiled headers
        return 0
    use_folder(folder)
    config.fx_graph_cache = False  # compile for real, whatever the cache dir holds

    def kernel(x: torch.Tensor) -> torch.Tensor:
        return (torch.sin(x) + 1).sum(-1)

    torch.compile(kernel)(torch.randn(8, 64))
    return sum(1 for name in os.listdir(folder) if name.endswith(".gch"))


def keep_isa_check(into: str) -> int:
    """Copy the program inductor built in this process's cache dir to check that the
    compiler builds this CPU's vector instructions (its ``.cpp`` and ``.so``, known by
    their source) to ``into``, laid out as in a cache dir; the number of programs kept.
    Every process with a new cache dir builds it again (about 4 CPU-seconds, the most
    of a small model's cold compile after the header) unless it finds it there, so the
    parent lends a copy to each worker (:func:`gatekeeper.boundary.headers.lend`)."""
    from torch._inductor import cpu_vec_isa
    from torch._inductor.runtime.runtime_utils import cache_dir

    code = getattr(cpu_vec_isa.VecISA, "_avx_code", None)
    if not isinstance(code, str):  # a torch that checks otherwise
        return 0
    root, kept = cache_dir(), 0
    for sub in sorted(os.listdir(root)):
        if len(sub) != 2 or not os.path.isdir(os.path.join(root, sub)):
            continue
        for name in sorted(os.listdir(os.path.join(root, sub))):
            src = os.path.join(root, sub, name)
            if not name.endswith(".cpp") or not os.path.isfile(src[:-4] + ".so"):
                continue
            with open(src) as f:
                if f.read() != code:
                    continue
            os.makedirs(os.path.join(into, sub), exist_ok=True)
            for path in (src, src[:-4] + ".so"):
                shutil.copyfile(path, os.path.join(into, sub, os.path.basename(path)))
            kept += 1
    return kept


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m gatekeeper.worker.headers FOLDER", file=sys.stderr)
        return 2
    built = build(argv[0])
    kept = keep_isa_check(os.path.join(argv[0], ISA_PART))
    print(f"gatekeeper headers: {built} precompiled header(s), {kept} ISA check in {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
