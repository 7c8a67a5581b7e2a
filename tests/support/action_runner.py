"""action.yml, run the way the Actions runner runs a composite action: the machinery
and fixtures of the tests in tests/action/.

The runner's part is played by :class:`CompositeRunner`: it parses action.yml, gives
each input its value or its default, and for each step evaluates ``if:`` and the
``${{ }}`` expressions of ``env:`` with :class:`Expr` (the subset of GitHub's expression
language that action.yml uses: contexts ``inputs``, ``github``, ``steps``, ``env``,
``runner``; literals; ``== != && || !`` and parentheses; ``success() failure() always()
cancelled()``), then runs the ``run:`` script with ``bash --noprofile --norc -eo pipefail``
in a workspace, with a fresh GITHUB_OUTPUT and GITHUB_STEP_SUMMARY per step and the job's
GITHUB_ENV and GITHUB_PATH, and maps the action's outputs from the steps' outputs.

The install step really runs (once per session, in the ``installed`` fixture, about
15 s): the runner's Python is a virtual environment layered on this one (a ``.pth`` line
makes this venv's packages, torch among them, visible to it: torch installed, gatekeeper
not), and the action makes a venv of its own in the job's temp dir, sees the runner's
torch through it, and pip installs gatekeeper there from a copy of this repository (the
action's folder, as the runner downloads it). The later runs set
GATEKEEPER_ACTION_SKIP_INSTALL=true, the switch action.yml documents for runner images
that ship gatekeeper, with the action's venv first on PATH: what that install made. A
bait wheel ("torch 99") shows that the pip constraint, not luck, keeps the runner's
torch.

The flow test talks to moto's S3 server (``s3_bucket_uri``) and the fake GitHub API
(``github_api``) and compiles a tiny model for real.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.github_server import FakeGitHub
from support.helpers import TINY_MODEL, parity_only_config, write_project

ROOT = Path(__file__).resolve().parents[2]
ACTION = ROOT / "action.yml"
REPO = "acme/models"
PR = 7
MARKER = "<!-- gatekeeper-report -->"
WRITE_TOKEN = "ghs_write_token_for_tests"
READ_TOKEN = "ghs_read_only_token_for_tests"
SIGNING_KEY = "sk-test-5f1e0c2b9a7d4e63"

CONFIG = parity_only_config("[{ batch = 4 }]")

# the PR's version of the model: the same weights, outputs 1% off
DRIFTED_MODEL = TINY_MODEL.replace(
    "return self.fc2(torch.relu(self.fc1(x)))", "return self.fc2(torch.relu(self.fc1(x))) * 1.01"
)
assert DRIFTED_MODEL != TINY_MODEL

# a PR's model that does fc1's work twice for the same outputs: FLOPs per call +80%, which
# the gate's work rule (FLOPs grew beyond 5%) calls a regression, deterministically
HEAVIER_MODEL = TINY_MODEL.replace(
    "return self.fc2(torch.relu(self.fc1(x)))",
    "return self.fc2(torch.relu((self.fc1(x) + self.fc1(x)) / 2))",
)
assert HEAVIER_MODEL != TINY_MODEL


# ----------------------------------------------------------------------- expressions


class ExprError(Exception):
    pass


_TOKEN = re.compile(
    r"""\s*(?:
    (?P<str>'(?:[^']|'')*')
  | (?P<num>\d+(?:\.\d+)?)
  | (?P<op>==|!=|&&|\|\||!|\(|\)|,)
  | (?P<name>[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z_][A-Za-z0-9_-]*)*)
)""",
    re.VERBOSE,
)
_STATUS_FUNCTIONS = ("success", "failure", "always", "cancelled")


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ExprError(f"cannot parse {text[pos:]!r} in {text!r} (not in the subset)")
        kind = m.lastgroup
        assert kind is not None
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def _number(v: Any) -> float:
    """GitHub's coercion to a number, for comparing values of different types."""
    if v is None:
        return 0.0
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        s = v.strip()
        if s == "":
            return 0.0
        try:
            return float(int(s, 16)) if s.lower().startswith("0x") else float(s)
        except ValueError:
            return math.nan
    return math.nan  # objects and arrays


def truthy(v: Any) -> bool:
    if v is None or v is False or v == "":
        return False
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return not (v == 0 or math.isnan(v))
    return True


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.casefold() == b.casefold()  # GitHub compares strings ignoring case
    if type(a) is type(b) and not isinstance(a, (int, float)):
        return a == b
    x, y = _number(a), _number(b)
    return not (math.isnan(x) or math.isnan(y)) and x == y


def to_string(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    return str(v)


class Expr:
    """A recursive-descent evaluator of one expression against ``contexts``."""

    def __init__(
        self, text: str, contexts: dict[str, Any], functions: dict[str, Callable[[], Any]]
    ) -> None:
        self.text, self.contexts, self.functions = text, contexts, functions
        self.toks, self.i = _tokens(text), 0

    @classmethod
    def evaluate(
        cls, text: str, contexts: dict[str, Any], functions: dict[str, Callable[[], Any]]
    ) -> Any:
        e = cls(text, contexts, functions)
        value = e._or()
        if e.i != len(e.toks):
            raise ExprError(f"unexpected {e.toks[e.i][1]!r} in {text!r}")
        return value

    def _peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def _take(self, value: str | None = None) -> tuple[str, str]:
        tok = self._peek()
        if tok is None or (value is not None and tok[1] != value):
            raise ExprError(f"expected {value or 'a value'} in {self.text!r}")
        self.i += 1
        return tok

    def _or(self) -> Any:
        left = self._and()
        while self._peek() == ("op", "||"):
            self._take()
            right = self._and()
            left = left if truthy(left) else right
        return left

    def _and(self) -> Any:
        left = self._compare()
        while self._peek() == ("op", "&&"):
            self._take()
            right = self._compare()
            left = right if truthy(left) else left
        return left

    def _compare(self) -> Any:
        left = self._unary()
        tok = self._peek()
        if tok in (("op", "=="), ("op", "!=")):
            self._take()
            right = self._unary()
            return _equal(left, right) if tok[1] == "==" else not _equal(left, right)
        return left

    def _unary(self) -> Any:
        if self._peek() == ("op", "!"):
            self._take()
            return not truthy(self._unary())
        return self._primary()

    def _primary(self) -> Any:
        kind, text = self._take()
        if kind == "str":
            return text[1:-1].replace("''", "'")
        if kind == "num":
            return float(text)
        if (kind, text) == ("op", "("):
            value = self._or()
            self._take(")")
            return value
        if kind != "name":
            raise ExprError(f"unexpected {text!r} in {self.text!r}")
        if text in ("true", "false"):
            return text == "true"
        if text == "null":
            return None
        if self._peek() == ("op", "("):
            self._take()
            self._take(")")
            if text not in self.functions:
                raise ExprError(f"function {text}() is not in the subset")
            return self.functions[text]()
        return self._lookup(text)

    def _lookup(self, dotted: str) -> Any:
        head, *rest = dotted.split(".")
        if head not in self.contexts:
            raise ExprError(f"unknown context {head!r} in {self.text!r}")
        value: Any = self.contexts[head]
        for part in rest:
            if not isinstance(value, dict):
                return None
            matches = [v for k, v in value.items() if k.casefold() == part.casefold()]
            value = matches[0] if matches else None  # a missing property is null
        return value


_TEMPLATE = re.compile(r"\$\{\{(.*?)\}\}", re.DOTALL)


def render(value: Any, contexts: dict[str, Any], functions: dict[str, Callable[[], Any]]) -> str:
    """A ``with:``/``env:``/default value with its ``${{ }}`` parts evaluated, as a string."""
    if not isinstance(value, str):
        return to_string(value)
    return _TEMPLATE.sub(lambda m: to_string(Expr.evaluate(m.group(1), contexts, functions)), value)


def condition(text: Any, contexts: dict[str, Any], functions: dict[str, Callable[[], Any]]) -> bool:
    """An ``if:``: ``${{ }}`` optional; without a status function, ``success() && (…)``."""
    if isinstance(text, bool):
        return text and functions["success"]()
    s = str(text).strip()
    m = re.fullmatch(r"\$\{\{(.*)\}\}", s, re.DOTALL)
    expr = m.group(1) if m else s
    names = {t for k, t in _tokens(expr) if k == "name"}
    result = truthy(Expr.evaluate(expr, contexts, functions))
    if not names & set(_STATUS_FUNCTIONS):
        result = result and functions["success"]()
    return result


# ------------------------------------------------------------------------- the runner


@dataclass
class StepRun:
    id: str | None
    name: str
    outcome: str  # success | failure | skipped
    returncode: int | None
    log: str
    outputs: dict[str, str]
    seconds: float = 0.0


@dataclass
class ActionRun:
    outcome: str
    outputs: dict[str, str]
    steps: list[StepRun]
    summary: str
    masks: list[str] = field(default_factory=list)

    @property
    def log(self) -> str:
        return "\n".join(f"--- {s.name} ({s.outcome}) ---\n{s.log}" for s in self.steps)

    def step(self, name_or_id: str) -> StepRun:
        (found,) = [s for s in self.steps if name_or_id in (s.id, s.name)]
        return found

    def annotations(self, level: str) -> list[str]:
        return [
            line for s in self.steps for line in s.log.splitlines() if line.startswith(f"::{level}")
        ]


def parse_file_commands(text: str) -> dict[str, str]:
    """GITHUB_OUTPUT / GITHUB_ENV: ``name=value`` lines and ``name<<DELIM`` heredocs."""
    out: dict[str, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip():
            continue
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            body = []
            while lines[i] != delim:
                body.append(lines[i])
                i += 1
            i += 1
            out[name.lstrip("\ufeff")] = "\n".join(body)
        else:
            name, _, value = line.partition("=")
            out[name] = value
    return out


class CompositeRunner:
    """Runs action.yml's composite steps as the Actions runner does (see the module doc)."""

    def __init__(
        self, action_path: Path, workspace: Path, temp: Path, base_env: dict[str, str]
    ) -> None:
        self.action_path, self.workspace, self.temp = action_path, workspace, temp
        self.base_env = base_env
        self.action = yaml.safe_load((action_path / "action.yml").read_text())

    def run(
        self,
        inputs: dict[str, str],
        *,
        github: dict[str, Any],
        job_env: dict[str, str] | None = None,
    ) -> ActionRun:
        declared = self.action.get("inputs", {})
        unknown = set(inputs) - set(declared)
        assert not unknown, f"not inputs of action.yml: {unknown}"
        job_env = dict(job_env or {})
        run_dir = self.temp / f"run-{uuid.uuid4().hex[:8]}"
        runner_temp = run_dir / "runner-temp"
        runner_temp.mkdir(parents=True)
        github = {**github, "action_path": str(self.action_path), "workspace": str(self.workspace)}
        contexts: dict[str, Any] = {
            "github": github,
            "env": job_env,
            "steps": {},
            "runner": {"temp": str(runner_temp), "os": "Linux"},
            "inputs": {},
        }
        failed = False
        fns: dict[str, Callable[[], Any]] = {
            "success": lambda: not failed,
            "failure": lambda: failed,
            "always": lambda: True,
            "cancelled": lambda: False,
        }
        for name, spec in declared.items():  # defaults may use github.*, never inputs.*
            contexts["inputs"][name] = (
                inputs[name] if name in inputs else render(spec.get("default", ""), contexts, fns)
            )
        env_file, path_file = run_dir / "env", run_dir / "path"
        env_file.touch()
        path_file.touch()
        steps: list[StepRun] = []
        summary: list[str] = []
        masks: list[str] = []
        for n, step in enumerate(self.action["runs"]["steps"]):
            step_id, name = step.get("id"), step.get("name", step.get("run", "")[:40])
            assert "uses" not in step, "the action's steps are all run: steps"
            assert step.get("shell") == "bash", f"{name}: shell must be bash"
            if not condition(step.get("if", "success()"), contexts, fns):
                steps.append(StepRun(step_id, name, "skipped", None, "", {}))
                if step_id:
                    contexts["steps"][step_id] = {
                        "outputs": {},
                        "outcome": "skipped",
                        "conclusion": "skipped",
                    }
                continue
            output_file, summary_file = run_dir / f"output-{n}", run_dir / f"summary-{n}"
            output_file.touch()
            summary_file.touch()
            script = run_dir / f"step-{n}.sh"
            script.write_text(step["run"])
            env = {
                **self.base_env,
                **self._github_env(github, runner_temp),
                **job_env,
                **{k: render(v, contexts, fns) for k, v in (step.get("env") or {}).items()},
                "GITHUB_OUTPUT": str(output_file),
                "GITHUB_STEP_SUMMARY": str(summary_file),
                "GITHUB_ENV": str(env_file),
                "GITHUB_PATH": str(path_file),
            }
            extra_path = [p for p in path_file.read_text().splitlines() if p.strip()]
            if extra_path:
                env["PATH"] = os.pathsep.join([*reversed(extra_path), env["PATH"]])
            started = time.monotonic()
            proc = subprocess.run(
                ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                check=False,
                cwd=self.workspace,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=600,
            )
            outputs = parse_file_commands(output_file.read_text())
            outcome = "success" if proc.returncode == 0 else "failure"
            failed = failed or outcome == "failure"
            masks += [
                line.split("::add-mask::", 1)[1]
                for line in proc.stdout.splitlines()
                if line.startswith("::add-mask::")
            ]
            summary.append(summary_file.read_text())
            job_env.update(parse_file_commands(env_file.read_text()))
            env_file.write_text("")
            steps.append(
                StepRun(
                    step_id,
                    name,
                    outcome,
                    proc.returncode,
                    proc.stdout,
                    outputs,
                    time.monotonic() - started,
                )
            )
            print(f"action step {name!r}: {outcome} in {steps[-1].seconds:.1f} s")
            if step_id:
                contexts["steps"][step_id] = {
                    "outputs": outputs,
                    "outcome": outcome,
                    "conclusion": outcome,
                }
        outputs = {
            k: render(v["value"], contexts, fns) for k, v in self.action.get("outputs", {}).items()
        }
        return ActionRun(
            "failure" if failed else "success", outputs, steps, "".join(summary), masks
        )

    def _github_env(self, github: dict[str, Any], runner_temp: Path) -> dict[str, str]:
        """The variables the runner sets for every step (GITHUB_* and RUNNER_*)."""
        env = {
            "CI": "true",
            "GITHUB_ACTIONS": "true",
            "RUNNER_TEMP": str(runner_temp),
            "RUNNER_OS": "Linux",
            "GITHUB_ACTION_PATH": github["action_path"],
            "GITHUB_WORKSPACE": github["workspace"],
        }
        for key in (
            "event_name",
            "event_path",
            "repository",
            "api_url",
            "server_url",
            "ref_name",
            "base_ref",
            "head_ref",
            "sha",
            "run_id",
        ):
            if github.get(key) is not None:
                env[f"GITHUB_{key.upper()}"] = str(github[key])
        return env


# ------------------------------------------------------------------- the environment


@pytest.fixture(scope="session")
def action_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This repository as the runner downloads an action: its files, without build state."""
    dest = tmp_path_factory.mktemp("action") / "gatekeeper"
    shutil.copytree(
        ROOT,
        dest,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv",
            "__pycache__",
            "*.egg-info",
            "build",
            "dist",
            ".pytest_cache",
            ".mypy_cache",
            ".ruff_cache",
            ".gatekeeper",
            "results.json",
            "report.md",
        ),
    )
    return dest


def _layered_venv(root: Path, with_parent_packages: bool) -> Path:
    """A venv; with ``with_parent_packages`` this interpreter's packages (torch…) are
    visible in it, so that it plays a runner's Python with torch already installed."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    if with_parent_packages:
        purelib = Path(
            subprocess.check_output(
                [
                    str(root / "bin" / "python"),
                    "-c",
                    "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                ],
                text=True,
            ).strip()
        )
        dirs = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
        (purelib / "runner-packages.pth").write_text("".join(f"{d}\n" for d in dirs))
    return root / "bin"


@pytest.fixture(scope="session")
def runner_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runner's Python (its bin folder): torch installed, gatekeeper not."""
    return _layered_venv(tmp_path_factory.mktemp("runner") / "venv", with_parent_packages=True)


def _pull_request_event(
    head_repo: str,
    number: int = PR,
    *,
    base_sha: str = "b" * 40,
    head_sha: str = "a" * 40,
    labels: tuple[str, ...] = (),
    action: str = "synchronize",
) -> dict[str, Any]:
    return {
        "action": action,
        "number": number,
        "repository": {"full_name": REPO},
        "pull_request": {
            "number": number,
            "labels": [{"id": i, "name": name, "color": "ededed"} for i, name in enumerate(labels)],
            "base": {"ref": "main", "sha": base_sha, "repo": {"full_name": REPO}},
            "head": {"ref": "feature", "sha": head_sha, "repo": {"full_name": head_repo}},
        },
    }


@dataclass
class Harness:
    runner: CompositeRunner
    github_api: FakeGitHub
    events: Path
    job_env: dict[str, str] = field(default_factory=dict)

    def at(self, workspace: Path) -> Harness:
        """The same runner, playing a job whose workspace is ``workspace``."""
        r = self.runner
        return Harness(
            CompositeRunner(r.action_path, workspace, r.temp, r.base_env),
            self.github_api,
            self.events,
            self.job_env,
        )

    def pull_request(
        self,
        inputs: dict[str, str],
        *,
        head_repo: str = REPO,
        token: str = WRITE_TOKEN,
        event: dict[str, Any] | None = None,
        server_url: str = "https://github.example",
        **kw: Any,
    ) -> ActionRun:
        """A pull_request run; ``event`` (default: a synchronize of PR 7) is the payload."""
        path = self.events / f"pr-{uuid.uuid4().hex[:6]}.json"
        path.write_text(json.dumps(event or _pull_request_event(head_repo)))
        return self.runner.run(
            inputs,
            github={
                "event_name": "pull_request",
                "event_path": str(path),
                "event": json.loads(path.read_text()),
                "repository": REPO,
                "api_url": self.github_api.url,
                "server_url": server_url,
                "token": token,
                "ref_name": f"{PR}/merge",
                "base_ref": "main",
                "head_ref": "feature",
                "sha": "c" * 40,
                "run_id": "1001",
            },
            job_env={**self.job_env, **kw.pop("job_env", {})},
            **kw,
        )

    def push(self, inputs: dict[str, str], **kw: Any) -> ActionRun:
        path = self.events / f"push-{uuid.uuid4().hex[:6]}.json"
        path.write_text(json.dumps({"ref": "refs/heads/main", "repository": {"full_name": REPO}}))
        return self.runner.run(
            inputs,
            github={
                "event_name": "push",
                "event_path": str(path),
                "event": {},
                "repository": REPO,
                "api_url": self.github_api.url,
                "server_url": "https://github.example",
                "token": WRITE_TOKEN,
                "ref_name": "main",
                "sha": "d" * 40,
                "run_id": "1000",
            },
            job_env={**self.job_env, **kw.pop("job_env", {})},
            **kw,
        )


def _runner_env(bin_dir: Path) -> dict[str, str]:
    """This process's environment (S3 settings included) as the runner's, minus any
    GitHub Actions variables of an outer run, with the runner's Python first on PATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GITHUB_", "RUNNER_", "GATEKEEPER_"))
        and k not in ("GH_TOKEN", "VIRTUAL_ENV", "PYTHONPATH", "TORCHINDUCTOR_CACHE_DIR")
    }
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    # one thread: a busy 2-core machine then slows the tiny model a little, not 50x
    # (an OpenMP team waiting for a descheduled thread); every run uses the same env key
    env["OMP_NUM_THREADS"] = "1"
    return env


@pytest.fixture
def harness(
    action_dir: Path,
    installed: Installed,
    tmp_path: Path,
    s3_bucket_uri: str,
    github_api: FakeGitHub,
) -> Harness:
    github_api.add_actions_token(WRITE_TOKEN, write=True)
    github_api.add_actions_token(READ_TOKEN, write=False)
    workspace = write_project(tmp_path / "workspace", TINY_MODEL, CONFIG)
    events = tmp_path / "events"
    events.mkdir()
    assert installed.run.step("setup").outcome == "success", installed.run.log
    runner = CompositeRunner(action_dir, workspace, tmp_path, _runner_env(installed.bin))
    # the install step ran for real in `installed`; here it finds gatekeeper installed
    return Harness(runner, github_api, events, {"GATEKEEPER_ACTION_SKIP_INSTALL": "true"})


def _torch_of(python: Path) -> tuple[str, str]:
    out = subprocess.check_output(
        [
            str(python),
            "-c",
            (
                "import importlib.metadata as m, torch; "
                "print(m.version('torch')); print(torch.__file__)"
            ),
        ],
        text=True,
    )
    version, file = out.split()
    return version, file


def _bucket_keys(s3_bucket_uri: Any) -> set[str]:
    import boto3

    client = boto3.client("s3", endpoint_url=s3_bucket_uri.endpoint_url)
    keys: set[str] = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=s3_bucket_uri.bucket):
        keys |= {obj["Key"] for obj in page.get("Contents", ())}
    return keys


@dataclass
class Installed:
    """The action's install step, run once for real: the venv it made in the job's temp
    dir (``bin``: gatekeeper there, the runner's torch seen through it), the runner's
    Python it left as it was (``runner``), and the run."""

    bin: Path
    runner: Path
    torch_before: tuple[str, str]
    run: ActionRun


@pytest.fixture(scope="session")
def installed(
    action_dir: Path, runner_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> Installed:
    before = _torch_of(runner_python / "python")
    tmp = tmp_path_factory.mktemp("install")
    runner = CompositeRunner(action_dir, tmp, tmp, _runner_env(runner_python))
    # a quick command: the config is absent, so gatekeeper stops with a usage error
    run = runner.run(
        {"command": "compile", "config": "absent.toml", "comment": "false"},
        github={"event_name": "push", "repository": REPO, "token": ""},
    )
    python = run.step("setup").outputs.get("python")
    assert python, run.log
    return Installed(Path(python).parent, runner_python, before, run)
