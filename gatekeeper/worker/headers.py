"""``python -m gatekeeper.worker.headers FOLDER PART...``: build inductor's precompiled
C++ headers into FOLDER, running no model code (docs/configuration.md, "Shared
precompiled headers"). A part is ``kernels`` (the header every CPU kernel of a JIT
compile includes, and the ISA check) or ``aoti`` (the two an AOTInductor package's CPU
build includes: its wrapper's and its kernels', built apart from the JIT's, about 20
CPU-seconds per package), each into ``FOLDER/<part>.part`` (where the parent linked
the headers FOLDER has, which are used, not built again) for the parent to move into
FOLDER and name in the part's stamp. The parent starts it, in a box whose only
writable places are FOLDER and its own scratch, before the first model worker of a
machine, torch and compiler; model workers see FOLDER read-only and link its headers
into their own temp dir.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

from ..boundary.headers import ISA_PART, USED


def use_folder(folder: str) -> None:
    """Point this process's inductor at ``folder`` for its precompiled headers (and
    their locks); torch reads the place once, when it is imported."""
    from torch._inductor import codecache

    codecache._HEADER_DIR = folder
    codecache._HEADER_LOCK_DIR = os.path.join(folder, "locks")


def build(folder: str, aoti: bool = False) -> int:
    """Compile one small function on the CPU with the header folder pointed at
    ``folder`` (``aoti``: package it with AOTInductor instead, whose headers inductor
    names by the package's build command for the device, not by the model, so they
    serve every CPU package this torch and compiler build); the number of headers the
    folder then holds."""
    import tempfile

    import torch
    from torch._inductor import codecache, config

    if not hasattr(codecache, "_HEADER_DIR"):  # a torch without precompiled headers
        return 0
    use_folder(folder)
    config.fx_graph_cache = False  # compile for real, whatever the cache dir holds

    def kernel(x: torch.Tensor) -> torch.Tensor:
        return (torch.sin(x) + 1).sum(-1)

    class Kernel(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return kernel(x)

    x = torch.randn(8, 64)
    if aoti:
        program = torch.export.export(Kernel(), (x,))
        with tempfile.TemporaryDirectory() as tmp:
            torch._inductor.aoti_compile_and_package(program, package_path=f"{tmp}/headers.pt2")
    else:
        torch.compile(kernel)(x)
    return sum(1 for name in os.listdir(folder) if name.endswith(".gch"))


def _isa_classes() -> list[type]:
    """Inductor's ``VecISA`` and every subclass of it, transitively."""
    from torch._inductor import cpu_vec_isa

    found: list[type] = []
    todo: list[type] = [cpu_vec_isa.VecISA]
    while todo:
        cls = todo.pop()
        if cls not in found:
            found.append(cls)
            todo.extend(cls.__subclasses__())
    return found


def _isa_programs() -> set[str]:
    """The sources inductor compiles to check this CPU's vector instructions: every
    ``*_code`` of ``VecISA`` and its subclasses (the ISA's own, and AVX-512's bf16 and
    VNNI and AMX's extra checks, each built with its own flags)."""
    return {
        v
        for cls in _isa_classes()
        for k, v in vars(cls).items()
        if k.endswith("_code") and isinstance(v, str)
    }


def forget_isa_check() -> None:
    """Forget the answer to inductor's ISA check this process may hold (a server's
    child inherits it: :func:`gatekeeper.worker.imports.check_isa`), so that this
    worker's compile builds the ISA check programs it keeps (:func:`keep_isa_check`)."""
    from torch._inductor import cpu_vec_isa

    for holder in [cpu_vec_isa, *_isa_classes()]:
        for f in list(vars(holder).values()):
            if hasattr(f, "cache_clear"):
                f.cache_clear()


def keep_isa_check(into: str) -> int:
    """Copy the programs inductor built in this process's cache dir to check that the
    compiler builds this CPU's vector instructions (each ``.cpp`` and ``.so``, known by
    their source: :func:`_isa_programs`) to ``into``, laid out as in a cache dir; the
    number of programs kept. Every process with a new cache dir builds them again
    (about 4 CPU-seconds, the most of a small model's cold compile after the header)
    unless it finds them there, so the parent lends a copy to each worker
    (:func:`gatekeeper.boundary.headers.lend`)."""
    from torch._inductor.runtime.runtime_utils import cache_dir

    codes = _isa_programs()
    if not codes:  # a torch that checks otherwise
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
                if f.read() not in codes:
                    continue
            os.makedirs(os.path.join(into, sub), exist_ok=True)
            for path in (src, src[:-4] + ".so"):
                shutil.copyfile(path, os.path.join(into, sub, os.path.basename(path)))
            kept += 1
    return kept


PARTS = ("kernels", "aoti")


def _recorded() -> list[str]:
    """The names of the headers inductor's compiles in this process ask for (a torch
    without precompiled headers: none), recorded from now on."""
    from torch._inductor import codecache

    used: list[str] = []
    real = getattr(codecache, "_precompile_header", None)
    if real is None:
        return used

    def recording(*args: object, **kwargs: object) -> str:
        path = real(*args, **kwargs)
        used.append(os.path.basename(path))
        return path

    codecache._precompile_header = recording  # type: ignore[assignment]
    return used


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not set(argv[1:]) <= set(PARTS):
        print(
            f"usage: python -m gatekeeper.worker.headers FOLDER {{{','.join(PARTS)}}}...",
            file=sys.stderr,
        )
        return 2
    folder, parts = argv[0], argv[1:]
    forget_isa_check()
    used = _recorded()
    for part in parts:  # each into its own staging folder: the parent names what it built
        staged = os.path.join(folder, f"{part}.part")
        os.makedirs(staged, exist_ok=True)
        used.clear()
        built = build(staged, aoti=part == "aoti")
        with open(os.path.join(staged, USED), "w") as f:
            json.dump(sorted(set(used)), f)
        print(f"gatekeeper headers: {built} precompiled header(s) of {part} in {staged}")
        if part == "kernels":
            kept = keep_isa_check(os.path.join(folder, ISA_PART))
            print(f"gatekeeper headers: {kept} ISA check in {folder}")
    return 0


if __name__ == "__main__":
    from . import end

    end(main(sys.argv[1:]))
