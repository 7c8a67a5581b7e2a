"""A CPU budget per test file (a pytest plugin, loaded by tests/conftest.py).

Each test file's CPU seconds (user + system of the pytest process and of every child it
waited for: the CLI processes, their workers, the servers a fixture stopped) are counted
from its first test's setup to its last test's teardown, in the process that ran it
(``--dist loadfile`` runs a file in one xdist worker). At the end the slowest files are
printed, and a file over its budget in ``tests/cpu_budget.toml`` fails the run with the
figure: growth of the suite is a decision (raise the budget in the same change), not
drift. ``GATEKEEPER_CPU_BUDGET=off`` prints the figures and fails nothing;
``GATEKEEPER_CPU_REPORT=PATH`` adds every file's figure to the JSON object at PATH (the
table's calibration: run the whole suite with it, then set each budget to about 1.5x).

A session-scoped fixture is paid by the first file that asks for it, so budgets carry a
margin for whichever file that is on a given run. The workers forked by the session's
worker server (tests/conftest.py) are that server's children: its CPU is read from
``/proc`` while it lives (:data:`watched`), so each file counts the workers it caused.
"""

from __future__ import annotations

import json
import os
import resource
import tomllib
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
BUDGETS = TESTS / "cpu_budget.toml"
SHOWN = 15


# long-lived children of the session whose CPU a file's tests cause (the session's worker
# server: the workers it forks are its children, reaped by it, not by pytest): their CPU
# (their own and their reaped children's, from /proc) is counted while they live; once
# one is reaped, the same seconds are in RUSAGE_CHILDREN instead
watched: list[int] = []


def _tree_cpu(pid: int) -> float:
    """CPU seconds of a live process and of its reaped children (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(int(x) for x in fields[11:15]) / ticks  # utime stime cutime cstime


def cpu_now() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    served = sum(_tree_cpu(pid) for pid in watched)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + served


def _file(item: pytest.Item | None) -> str | None:
    if item is None:
        return None
    path = Path(str(item.path))
    return path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else str(path)


def load_budgets(path: Path = BUDGETS) -> tuple[float, dict[str, float]]:
    """(the default budget, each listed file's)."""
    doc = tomllib.loads(path.read_text())
    return float(doc["default"]), {k: float(v) for k, v in doc.get("files", {}).items()}


def over_budget(used: dict[str, float], path: Path = BUDGETS) -> list[str]:
    """A line for each file over its budget, largest overrun first."""
    default, files = load_budgets(path)
    over = [(cpu - files.get(f, default), f, cpu, files.get(f, default)) for f, cpu in used.items()]
    return [
        f"{f}: {cpu:.1f} CPU-s, over its budget of {budget:g} in {path.name} (+{excess:.1f})"
        for excess, f, cpu, budget in sorted(over, reverse=True)
        if excess > 0
    ]


class CpuBudget:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.used: dict[str, float] = {}
        self.start: float | None = None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        here = _file(item)
        if self.start is None:
            self.start = cpu_now()
        yield
        if here is not None and _file(nextitem) != here:  # the file's last test, torn down
            now = cpu_now()
            self.used[here] = self.used.get(here, 0.0) + now - self.start
            self.start = None

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(self.config, "workerinput"):  # an xdist worker: the controller reports
            self.config.workeroutput["cpu_by_file"] = self.used  # type: ignore[attr-defined]
            return
        if not self.used:
            return
        if report := os.environ.get("GATEKEEPER_CPU_REPORT"):
            path = Path(report)
            known = json.loads(path.read_text()) if path.is_file() else {}
            # a file's largest figure of the sessions (tiers) that wrote here: each is
            # held to its budget alone (the serial tier used to overwrite the parallel's)
            both = {f: max(known.get(f, 0.0), cpu) for f, cpu in self.used.items()}
            path.write_text(json.dumps(known | both, indent=1, sort_keys=True))
        over = over_budget(self.used)
        if over and os.environ.get("GATEKEEPER_CPU_BUDGET", "").lower() != "off":
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        self.over = over

    @pytest.hookimpl(optionalhook=True)  # xdist's
    def pytest_testnodedown(self, node, error) -> None:
        for f, cpu in getattr(node, "workeroutput", {}).get("cpu_by_file", {}).items():
            self.used[f] = self.used.get(f, 0.0) + cpu

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.used:
            return
        tr = terminalreporter
        tr.section("CPU seconds per test file (children included)")
        ranked = sorted(self.used.items(), key=lambda kv: -kv[1])
        for f, cpu in ranked[:SHOWN]:
            tr.write_line(f"{cpu:8.1f}  {f}")
        tr.write_line(f"{sum(self.used.values()):8.1f}  in all, {len(self.used)} files")
        for line in getattr(self, "over", []):
            tr.write_line(f"CPU budget: {line}", red=True)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(CpuBudget(config), "cpu_budget")
