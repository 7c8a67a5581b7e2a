"""The package's shape, held where issue 33 drew it (read from the source with ``ast``:
tests/support/structure.py; ``benchmarks/structure.py`` prints the figures):

* no import cycle, imports inside functions counted;
* no module over 500 lines, no function over 80;
* no module outside ``gatekeeper/kinds/`` (each kind's folder, and the worker's dispatch
  to the kinds' halves, ``gatekeeper/worker/kinds/``) branches on an artifact kind's name;
* the process boundary is a folder: nothing outside ``boundary/`` (the parent's side)
  and the kinds' worker halves imports ``worker/`` (the torch child), and nothing
  ``boundary/`` imports, itself included, imports torch as it is imported (its elastic
  agent imports torch inside functions, in a process of its own);
* a kind is one folder, ``kinds/<name>/``: its parent half (``__init__.py``) and its
  worker half (``worker.py``, ``worker_*.py``), which no module imports but the worker
  halves themselves (the worker imports it by its reference, ``"module:attribute"``);
* no module but ``gatekeeper/metrics.py`` (the registry) keeps a list of metrics: their
  names, labels, columns or threshold settings, or the work counters.

Each check is shown to fail on a planted case first: a check that finds nothing in a
tree built to have it would pass whatever the package did.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support import structure

from gatekeeper import kinds, metrics
from gatekeeper.results import Work

BOUNDARY = "gatekeeper.boundary"
KINDS_HOME = ("gatekeeper.kinds", "gatekeeper.worker.kinds")
BELOW_KINDS = (
    "gatekeeper.config",
    "gatekeeper.targets",
    "gatekeeper.results",
    "gatekeeper.boundary.protocol",
    "gatekeeper.warmed",
)


def plant(root: Path, files: dict[str, str]) -> Path:
    """A package ``gatekeeper`` of ``files`` under ``root`` (paths relative to it)."""
    pkg = root / "gatekeeper"
    for rel, text in {"__init__.py": "", **files}.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return pkg


@pytest.fixture(autouse=True)
def _fresh_cache():
    structure.modules.cache_clear()
    yield
    structure.modules.cache_clear()


def test_the_checks_find_what_is_planted(tmp_path: Path) -> None:
    pkg = plant(
        tmp_path,
        {
            "a.py": "from . import b\n",
            "b.py": "def f():\n    from .c import g\n",  # inside a function: counted
            "c.py": "from .a import x\n",
            "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import e\n",
            "e.py": "from . import d\n",  # d's import never runs: no cycle
            "k.py": 'def f(t):\n    return t.strategy == "aot" or t.id.endswith("+regional")\n',
            "long.py": "def f():\n" + "    x = 1\n" * 81 + "\n" * 420,
            "worker/__init__.py": "",
            "worker/deps.py": "",
            "parent.py": "from .worker import deps\nfrom .worker.deps import x\n",
            "boundary/__init__.py": "",
            "kinds/__init__.py": "",
            "kinds/toy/__init__.py": "",
            "kinds/toy/worker.py": "from ...worker.deps import x\nfrom . import worker_pkg\n",
            "kinds/toy/worker_pkg.py": "",
            "kinds/toy/parent.py": "def f():\n    from .worker import x\n",
            "boundary/client.py": "from ..worker.deps import x\nfrom . import spawn\n",
            # torch at import time (spawn), not inside a function or for types (client)
            "boundary/spawn.py": "import os, torch.cuda\ndef f():\n    import torch\n",
            # a module-level list of metrics is one; a tuple inside a function is not
            "m.py": 'C = {"flops": 1, "kernels": 1}\ndef f():\n    return ("flops", "kernels")\n',
        },
    )
    assert structure.cycles(structure.import_graph(pkg)) == [
        ["gatekeeper.a", "gatekeeper.b", "gatekeeper.c"]
    ]
    found = structure.kind_comparisons(["aot", "regional"], pkg)
    assert [(c.module, c.line) for c in found] == [("gatekeeper.k", 2), ("gatekeeper.k", 2)]
    assert structure.long_modules(pkg) == [("gatekeeper.long", 502)]
    assert structure.long_functions(pkg) == [("gatekeeper.long.f", 82)]
    reach = structure.worker_imports(pkg)
    assert reach["gatekeeper.parent"] == {"gatekeeper.worker.deps"}
    assert reach["gatekeeper.boundary.client"] == {"gatekeeper.worker.deps"}
    assert reach["gatekeeper.kinds.toy.worker"] == {"gatekeeper.worker.deps"}
    # of those, only the boundary's and a kind's worker half may
    assert structure.stray_worker_imports(pkg) == {"gatekeeper.parent": {"gatekeeper.worker.deps"}}
    assert structure.worker_half_importers(pkg) == {
        "gatekeeper.kinds.toy.parent": {"gatekeeper.kinds.toy.worker"}
    }
    assert structure.reachable(["gatekeeper.boundary.client"], pkg) == {
        "gatekeeper.boundary.client",
        "gatekeeper.boundary.spawn",
        "gatekeeper.worker.deps",
    }
    assert structure.eager_imports("gatekeeper.boundary.spawn", "torch", pkg) == [1]
    assert structure.eager_imports("gatekeeper.boundary.client", "torch", pkg) == []
    lists = structure.metric_lists(["flops", "kernels"], pkg)
    assert [(m.module, m.line, m.names) for m in lists] == [
        ("gatekeeper.m", 1, ("flops", "kernels"))
    ]


def test_the_figures_count_types_only_imports_folders_and_prose(tmp_path: Path) -> None:
    """benchmarks/structure.py's figures: a circle made only of ``if TYPE_CHECKING:``
    imports counts with the switch (and only then), files are counted per folder, and a
    docstring's or comment's lines are prose, a trailing comment's line code."""
    pkg = plant(
        tmp_path,
        {
            "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import e\n",
            "e.py": '"""Two\nlines."""\n\n# why\nfrom . import d  # trailing\n',
            "sub/__init__.py": "x = '# not a comment'\n",
        },
    )
    assert structure.cycles(structure.import_graph(pkg)) == []
    assert structure.cycles(structure.import_graph(pkg, type_checking=True)) == [
        ["gatekeeper.d", "gatekeeper.e"]
    ]
    assert structure.reachable(["gatekeeper.d"], pkg) == {"gatekeeper.d"}
    assert structure.reachable(["gatekeeper.d"], pkg, type_checking=True) == {
        "gatekeeper.d",
        "gatekeeper.e",
    }
    assert structure.files_per_folder(pkg) == {"gatekeeper": 3, "gatekeeper/sub": 1}
    assert structure.prose(pkg) == structure.Prose(docstring=2, comment=1, trailing=1, code=5)


def test_the_benchmark_reads_another_checkout(tmp_path: Path) -> None:
    """``benchmarks/structure.py --root`` prints the figures of that checkout's package,
    not of the installed one (the before-and-after figures depend on it)."""
    plant(
        tmp_path,
        {
            "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a2\n",
            "a2.py": "from . import a\n",
        },
    )
    script = Path(__file__).parents[1] / "benchmarks" / "structure.py"
    out = subprocess.run(
        [sys.executable, str(script), "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "files per folder: 3 files in 1 folders" in out
    assert "included: 1\n  2 modules: a a2\n" in out
    assert "prose lines per code line: 0.00" in out


def test_no_import_cycle() -> None:
    assert structure.cycles(structure.import_graph()) == []


def test_no_import_cycle_even_for_types() -> None:
    """A 15-module circle ran through ``if TYPE_CHECKING:`` imports: the kinds typed
    their hooks with the config, the targets, the protocol and warm's result, and each
    of those imported the kinds (issue 40). Types both sides need live below both."""
    assert structure.cycles(structure.import_graph(type_checking=True)) == []


def test_the_schema_targets_protocol_and_documents_sit_below_the_kinds() -> None:
    """The config is a schema (its reader passes the kinds' checks in), a target is
    data (gatekeeper.project expands a config, asking the kinds), the protocol carries
    the kind its caller names, and warm's result is a record the kinds' packages fill:
    none of them imports the kinds, not even for a type."""
    found = {}
    for m in BELOW_KINDS:
        reach = structure.reachable([m], type_checking=True)
        if up := sorted(k for k in reach if k.split(".")[:2] == ["gatekeeper", "kinds"]):
            found[m] = up
    assert found == {}


def test_no_module_over_500_lines_and_no_function_over_80() -> None:
    assert structure.long_modules() == []
    assert structure.long_functions() == []


def test_only_the_kinds_branch_on_a_kinds_name() -> None:
    names = [*kinds.names(), *kinds.package_names()]
    assert {"whole", "regional", "aot", "precompile"} <= set(names)
    found = [
        f"{c.module}:{c.line} {c.code}"
        for c in structure.kind_comparisons(names)
        if not c.module.startswith(KINDS_HOME)
    ]
    assert found == []


def test_only_the_boundary_and_the_kinds_worker_halves_import_the_worker() -> None:
    assert structure.stray_worker_imports() == {}


def test_a_kind_is_one_folder_whose_worker_half_nothing_imports() -> None:
    """Each built-in kind was spread over kinds/<name>.py and worker/kinds/<name>.py
    (aot also worker/kinds/aot_package.py); its halves now sit in kinds/<name>/, its
    worker half reaches the worker only by reference, and worker/kinds/ keeps only the
    dispatch and its interfaces."""
    modules = structure.modules()
    for name in ("whole", "regional", "aot", "precompile"):
        assert {f"gatekeeper.kinds.{name}", f"gatekeeper.kinds.{name}.worker"} <= set(modules)
        assert modules[f"gatekeeper.kinds.{name}"].name == "__init__.py"
    assert {m for m in modules if m.startswith("gatekeeper.worker.kinds")} == {
        "gatekeeper.worker.kinds",
        "gatekeeper.worker.kinds.base",
    }
    for name in ("whole", "regional", "aot"):
        assert kinds.get(name).worker.startswith(f"gatekeeper.kinds.{name}.worker:")
    for name in ("aot", "precompile"):
        assert kinds.package(name).worker.startswith(f"gatekeeper.kinds.{name}.worker")
    assert structure.worker_half_importers() == {}


def test_the_boundary_imports_no_torch_as_it_is_imported() -> None:
    ours = [m for m in structure.modules() if m == BOUNDARY or m.startswith(BOUNDARY + ".")]
    assert {"gatekeeper.boundary.client", "gatekeeper.boundary.elastic"} <= set(ours)
    found = {
        m: lines
        for m in sorted(structure.reachable(ours))
        if (lines := structure.eager_imports(m, "torch"))
    }
    assert found == {}
    # the one module here that uses torch does so inside its functions
    assert "torch" in structure.modules()["gatekeeper.boundary.elastic"].read_text()


def metric_words() -> set[str]:
    """What names a metric: its name, label, columns, setting, chart title; the groups
    and the work counters' fields."""
    words: set[str | None] = {*metrics.GROUPS, *Work.model_fields}
    for m in metrics.registry():
        words |= {m.name, m.label, m.threshold, m.column, m.heading}
        words.add(m.chart.title if m.chart else None)
    return {w for w in words if w}


def test_metrics_are_listed_only_in_the_registry() -> None:
    """The gate's WORK_COUNTERS (2) and the dashboard's (4) drifted apart; bisect kept
    its own names and settings, the markdown its headers."""
    found = [
        f"{m.module}:{m.line} {', '.join(m.names)}"
        for m in structure.metric_lists(metric_words())
        if m.module != "gatekeeper.metrics"
    ]
    assert found == []
