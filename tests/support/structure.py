"""The shape of the package, read from its source with ``ast`` (nothing is imported):
the import graph and its cycles, modules and functions by length, comparisons against
an artifact kind's name, which worker modules the parent imports, where a module
imports torch as it is imported, files per folder, and prose lines against code lines.

``tests/test_structure.py`` holds the lines these draw; ``benchmarks/structure.py``
prints the figures.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import gatekeeper

ROOT = Path(gatekeeper.__file__).parent  # the package's folder
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def module_name(path: Path, root: Path = ROOT) -> str:
    """``gatekeeper/store/local.py`` -> ``gatekeeper.store.local`` (a package: its name)."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name."""
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


@cache
def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The nodes inside ``if TYPE_CHECKING:`` blocks: imports that never run."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skip.update(id(n) for n in ast.walk(child))
    return skip


def _known(name: str, known: dict[str, Path]) -> str:
    """The module ``name`` is, or the closest enclosing one (an attribute's module)."""
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imports(name: str, root: Path = ROOT, type_checking: bool = False) -> set[str]:
    """The package's modules that module ``name`` imports: at module level and inside
    functions alike, relative imports resolved, ``from pkg import mod`` as ``pkg.mod``;
    those under ``if TYPE_CHECKING:`` never run and count only with ``type_checking``.
    A package's ``__init__`` that Python runs on the way to a submodule is not counted:
    only what the code names."""
    known = modules(root)
    path = known[name]
    tree = parse(path)
    skip = set() if type_checking else _type_checking_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top = root.name
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {_known(a.name, known) for a in node.names if a.name.split(".")[0] == top}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != top:
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in known else _known(source, known))
    found.discard(name)
    return found


def import_graph(root: Path = ROOT, type_checking: bool = False) -> dict[str, set[str]]:
    """Each module's imports; with ``type_checking``, those for types only included."""
    return {name: imports(name, root, type_checking) for name in modules(root)}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's
    algorithm, iterative): each is a set of modules that import each other in a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next((e for e in edges if e in graph), None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def long_modules(root: Path = ROOT, limit: int = MAX_MODULE_LINES) -> list[tuple[str, int]]:
    """Modules of more than ``limit`` lines, longest first."""
    sizes = [(n, len(p.read_text().splitlines())) for n, p in modules(root).items()]
    return sorted(((n, s) for n, s in sizes if s > limit), key=lambda x: -x[1])


def long_functions(root: Path = ROOT, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """Functions and methods of more than ``limit`` lines (decorators aside, docstring
    included), longest first."""
    found = []
    for name, path in modules(root).items():
        for node in ast.walk(parse(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found.append((f"{name}.{node.name}", length))
    return sorted(found, key=lambda x: -x[1])


@dataclass(frozen=True)
class KindComparison:
    module: str
    line: int
    code: str


def _names_a_kind(node: ast.AST, names: set[str]) -> bool:
    """A string constant that is a kind's name or its variant part (``"aot"``,
    ``"+aot"``), or a tuple, list or set holding one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.removeprefix("+") in names
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_kind(e, names) for e in node.elts)
    return False


def kind_comparisons(names: Iterable[str], root: Path = ROOT) -> list[KindComparison]:
    """Where code branches on a kind's name: a comparison (``==``, ``!=``, ``in``) with
    it, a ``match`` case on it, or a test of an id's end or start for it
    (``endswith("+aot")``)."""
    wanted = set(names)
    found = []
    for name, path in modules(root).items():
        for node in ast.walk(parse(path)):
            operands: list[ast.AST] = []
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
            elif isinstance(node, ast.match_case) and isinstance(node.pattern, ast.MatchValue):
                operands = [node.pattern.value]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("endswith", "startswith", "removesuffix")
            ):
                operands = list(node.args)
            if any(_names_a_kind(o, wanted) for o in operands):
                code = ast.get_source_segment(path.read_text(), node) or ""
                line = getattr(node, "lineno", 0) or getattr(node.pattern, "lineno", 0)
                found.append(KindComparison(name, line, " ".join(code.split())[:80]))
    return found


def worker_imports(root: Path = ROOT) -> dict[str, set[str]]:
    """The modules of ``worker/`` each module outside it imports (the parent's side:
    only ``boundary/`` may)."""
    worker = f"{root.name}.worker"
    graph = import_graph(root)
    return {
        name: {m for m in targets if m == worker or m.startswith(worker + ".")}
        for name, targets in graph.items()
        if not (name == worker or name.startswith(worker + "."))
    }


def stray_worker_imports(root: Path = ROOT) -> dict[str, set[str]]:
    """:func:`worker_imports` of the modules that may not import ``worker/``: all but
    ``boundary/`` (the parent's side of the boundary) and the kinds' worker halves."""
    boundary = f"{root.name}.boundary"
    return {
        name: found
        for name, found in worker_imports(root).items()
        if found and not (name == boundary or name.startswith(boundary + ".") or worker_half(name))
    }


def worker_half(module: str) -> bool:
    """``gatekeeper.kinds.<name>.worker`` or ``.worker_<part>``: a kind's worker half."""
    parts = module.split(".")
    return (
        len(parts) == 4
        and parts[1] == "kinds"
        and (parts[3] == "worker" or parts[3].startswith("worker_"))
    )


def worker_half_importers(root: Path = ROOT) -> dict[str, set[str]]:
    """The kinds' worker halves each module but those halves imports."""
    return {
        m: found
        for m, imported in import_graph(root).items()
        if not worker_half(m) and (found := {i for i in imported if worker_half(i)})
    }


def eager_imports(name: str, top: str, root: Path = ROOT) -> list[int]:
    """The lines where module ``name`` imports package ``top`` (``torch``) as it is
    imported itself: outside any function and outside ``if TYPE_CHECKING:``."""
    tree = parse(modules(root)[name])
    skip = _type_checking_only(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            skip.update(id(n) for n in ast.walk(node))
    lines = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            heads = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            heads = [(node.module or "").split(".")[0]]
        else:
            continue
        if top in heads:
            lines.append(node.lineno)
    return sorted(lines)


def reachable(start: Iterable[str], root: Path = ROOT, type_checking: bool = False) -> set[str]:
    """``start`` and every module of the package they import, directly or not (with
    ``type_checking``, for types only too)."""
    graph = import_graph(root, type_checking)
    seen: set[str] = set()
    todo = list(start)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph.get(name, ()))
    return seen


@dataclass(frozen=True)
class MetricList:
    module: str
    line: int
    names: tuple[str, ...]


def metric_lists(names: Iterable[str], root: Path = ROOT) -> list[MetricList]:
    """Module-level constants that hold two or more of ``names`` as strings (in a tuple,
    list, set or dict, nested ones and ``Literal[...]`` included): a list of metrics, or
    of their settings, kept outside the registry."""
    wanted = set(names)
    found = []
    for name, path in modules(root).items():
        for node in parse(path).body:
            if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                continue
            held = {
                n.value
                for n in ast.walk(node.value)
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in wanted
            }
            if len(held) >= 2:
                found.append(MetricList(name, node.lineno, tuple(sorted(held))))
    return found


def files_per_folder(root: Path = ROOT) -> dict[str, int]:
    """The ``.py`` files directly in each folder of the package, by path from its
    parent (``gatekeeper/store``)."""
    counts: dict[str, int] = {}
    for path in modules(root).values():
        folder = path.parent.relative_to(root.parent).as_posix()
        counts[folder] = counts.get(folder, 0) + 1
    return dict(sorted(counts.items()))


@dataclass(frozen=True)
class Prose:
    docstring: int  # lines inside a module's, class's or function's docstring
    comment: int  # lines holding only a comment
    trailing: int  # comments after code on its line (the line counts as code)
    code: int  # every other line that is not blank


def _docstring_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = node.body[0] if node.body else None
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def prose(root: Path = ROOT) -> Prose:
    """The package's lines by what they hold: docstrings, comments, code."""
    doc = comment = trailing = code = 0
    for path in modules(root).values():
        text = path.read_text()
        docs = _docstring_lines(parse(path))
        comments = {
            t.start[0]: t.line[: t.start[1]].strip() == ""
            for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type == tokenize.COMMENT
        }
        for n, line in enumerate(text.splitlines(), 1):
            if n in docs:
                doc += 1
            elif comments.get(n):
                comment += 1
            elif line.strip():
                code += 1
                trailing += n in comments
    return Prose(doc, comment, trailing, code)
