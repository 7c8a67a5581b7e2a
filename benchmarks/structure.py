"""The structure figures of ``gatekeeper/``: comparisons against an artifact kind's name
outside ``gatekeeper/kinds/``, import cycles (imports inside functions counted, and again
with the imports under ``if TYPE_CHECKING:``), modules over 500 lines, functions over 80
lines, the imports of ``worker/`` from outside ``boundary/`` and the kinds' worker halves,
files per folder, prose lines per code line, and the path one ``gatekeeper check`` takes
from the CLI to the worker. Usage, from the repo root:

    python benchmarks/structure.py              # the static figures (no torch, instant)
    python benchmarks/structure.py --check-path # and the path (compiles a tiny model, ~1 min)
    python benchmarks/structure.py --root DIR   # the figures of another checkout's gatekeeper/

The static figures read the source with ``ast`` (``tests/support/structure.py``, which
``tests/test_structure.py`` holds to zero where it draws a line). Prose lines are the
lines of docstrings (module, class, function) and the lines holding only a comment;
code lines are the other lines that are not blank (a trailing comment's line is code,
and the trailing comments are counted apart). The path is traced: a tiny model is
compiled into a scratch store, then ``gatekeeper check`` runs in this process under
``sys.setprofile`` from ``commands/check.py``'s ``run`` until the parent starts its
first worker; at every call and return the module of the innermost gatekeeper frame is
noted (what an import runs, module and class bodies, counts as the importer's), and
consecutive repeats are folded.
It counts the modules visited and the returns to one visited before (in all, and as
distinct pairs of from and to), at two grains: modules, and rooms (a package such as
``store/`` or ``worker/`` is one room).
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]

# the kinds' names before gatekeeper/kinds/ existed (after: its registry's)
KINDS = ("whole", "regional", "aot", "precompile")


def load(root: Path | None) -> ModuleType:
    """tests/support/structure.py, the analyses themselves, read against ``gatekeeper``
    of ``root`` (a checkout; this one when None): it goes first on the path, so the
    package it imports, and so reads, is that checkout's."""
    sys.path[:0] = [*([str(root.resolve())] if root else []), str(ROOT / "tests")]
    structure = importlib.import_module("support.structure")
    if root and Path(structure.ROOT) != (root / "gatekeeper").resolve():
        sys.exit(f"error: {root}/gatekeeper was not the package imported ({structure.ROOT})")
    return structure


def kind_names(structure: ModuleType) -> list[str]:
    if not (structure.ROOT / "kinds").is_dir():  # a checkout from before the registry
        return list(KINDS)
    from gatekeeper import kinds

    return [*kinds.names(), *kinds.package_names()]


def static(structure: ModuleType) -> None:
    outside = [
        c
        for c in structure.kind_comparisons(kind_names(structure))
        if not c.module.startswith(("gatekeeper.kinds", "gatekeeper.worker.kinds"))
    ]
    files = sorted({c.module for c in outside})
    print(f"modules comparing a kind's name outside the kinds: {len(files)}")
    for c in outside:
        print(f"  {c.module}:{c.line}  {c.code}")
    found = structure.cycles(structure.import_graph())
    print(f"import cycles (modules importing each other in a circle): {len(found)}")
    for c in found:
        print(f"  {' '.join(c)}")
    found = structure.cycles(structure.import_graph(type_checking=True))
    print(f"import cycles, imports for types only (if TYPE_CHECKING:) included: {len(found)}")
    for c in found:
        print(f"  {len(c)} modules: {' '.join(m.removeprefix('gatekeeper.') for m in c)}")
    big = structure.long_modules()
    print(f"modules over {structure.MAX_MODULE_LINES} lines: {len(big)}")
    for name, n in big:
        print(f"  {n} {name}")
    longf = structure.long_functions()
    print(f"functions over {structure.MAX_FUNCTION_LINES} lines: {len(longf)}")
    for name, n in longf:
        print(f"  {n} {name}")
    reach = structure.stray_worker_imports()
    print(
        "parent modules importing worker/ (only boundary/ and kinds' worker halves may): "
        f"{len(reach)}"
    )
    for m, w in sorted(reach.items()):
        print(f"  {m}: {' '.join(sorted(w))}")
    folders = structure.files_per_folder()
    print(f"files per folder: {sum(folders.values())} files in {len(folders)} folders")
    for folder, n in sorted(folders.items(), key=lambda x: (-x[1], x[0])):
        print(f"  {n:3d} {folder}/")
    lines = structure.prose()
    prose = lines.docstring + lines.comment
    print(
        f"prose lines per code line: {prose / lines.code:.2f} ({prose} prose: "
        f"{lines.docstring} docstring + {lines.comment} comment; {lines.code} code; "
        f"{lines.trailing} trailing comments)"
    )


def trace_check(project: Path) -> list[str]:
    """The modules ``gatekeeper check`` passes through in this process, from commands/
    check.py's ``run`` to the first worker it starts (see the module doc)."""
    seq: list[str] = []
    state = {"on": False, "off": False}

    def gk_module(frame) -> str | None:
        """The module of the innermost gatekeeper function frame; what an import runs
        (a module's body, the class bodies in it, and what they call) is the
        importer's."""
        chain = []
        while frame is not None:
            chain.append(frame)
            frame = frame.f_back
        bodies = [
            i
            for i, f in enumerate(chain)
            if f.f_code.co_name == "<module>" and f.f_globals.get("__name__") != "__main__"
        ]
        for f in chain[bodies[-1] + 1 :] if bodies else chain:
            name = f.f_globals.get("__name__", "")
            if name.split(".")[0] == "gatekeeper" and f.f_code.co_name != "<module>":
                return name
        return None

    real_run = subprocess.run

    def run(*args, **kwargs):
        if sys._getframe(1).f_globals.get("__name__", "").startswith("gatekeeper.boundary"):
            state["off"] = True
        return real_run(*args, **kwargs)

    def profile(frame, event, arg) -> None:
        if state["off"] or event not in ("call", "return"):
            return
        if not state["on"]:
            name = frame.f_globals.get("__name__")
            if event != "call" or (name, frame.f_code.co_name) != (
                "gatekeeper.commands.check",
                "run",
            ):
                return
            state["on"] = True
        module = gk_module(frame if event == "call" else frame.f_back)
        if module and (not seq or seq[-1] != module):
            seq.append(module)

    os.chdir(project)
    from gatekeeper.cli import main

    subprocess.run = run  # type: ignore[assignment]
    sys.setprofile(profile)
    try:
        main(["check", "--out", "traced"])
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
        subprocess.run = real_run
    return seq


def walk_figures(walk: list[str]) -> tuple[list[str], int, int]:
    """(the places in order of first visit, returns to an earlier one, distinct returns)."""
    walk = [m for i, m in enumerate(walk) if i == 0 or walk[i - 1] != m]
    seen: list[str] = []
    back, pairs = 0, set()
    for prev, here in zip([None, *walk[:-1]], walk, strict=True):
        if here in seen:
            back += 1
            pairs.add((prev, here))
        else:
            seen.append(here)
    return seen, back, len(pairs)


def check_path() -> None:
    from support.helpers import parity_only_config, write_project

    with tempfile.TemporaryDirectory(prefix="gk-structure-") as tmp:
        # the tests' tiny model, timed briefly (tests/support/helpers.py)
        project = write_project(Path(tmp), config=parity_only_config("[{ batch = 4 }]"))
        subprocess.run(
            [sys.executable, "-m", "gatekeeper", "compile"],
            cwd=project,
            check=True,
            capture_output=True,
        )
        path = trace_check(project)

    def room(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 2 else ".".join(parts[1:]) or module

    for grain, walk in (("modules", path), ("rooms", [room(m) for m in path])):
        seen, back, pairs = walk_figures(walk)
        print(
            f"check's path, {grain}: {len(seen)} visited; {back} returns to an earlier "
            f"one ({pairs} distinct)"
        )
        print("  first visits:", " ".join(s.removeprefix("gatekeeper.") for s in seen))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check-path", action="store_true", help="also trace check's path")
    p.add_argument(
        "--root",
        type=Path,
        help="the checkout whose gatekeeper/ to read (default: this one)",
    )
    args = p.parse_args()
    static(load(args.root))
    if args.check_path:
        check_path()


if __name__ == "__main__":
    main()
