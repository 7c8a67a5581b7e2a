"""action.yml, run the way the Actions runner runs a composite action.

The runner's part is played by :class:`CompositeRunner`: it parses action.yml, gives
each input its value or its default, and for each step evaluates ``if:`` and the
``${{ }}`` expressions of ``env:`` with :class:`Expr` (the subset of GitHub's expression
language that action.yml uses: contexts ``inputs``, ``github``, ``steps``, ``env``,
``runner``; literals; ``== != && || !`` and parentheses; ``success() failure() always()
cancelled()``), then runs the ``run:`` script with ``bash --noprofile --norc -eo pipefail``
in a workspace, with a fresh GITHUB_OUTPUT and GITHUB_STEP_SUMMARY per step and the job's
GITHUB_ENV and GITHUB_PATH, and maps the action's outputs from the steps' outputs.

The install step really runs (once per module, in the ``installed`` fixture, about 10 s):
pip installs gatekeeper from a copy of this repository (the action's folder, as the
runner downloads it) into a virtual environment layered on this one (a ``.pth`` line
makes this venv's packages, torch among them, visible to it), so pip finds the runner's
torch installed and must keep it. (Installing into this venv itself would replace the
editable install of the code under test.) The later runs set
GATEKEEPER_ACTION_SKIP_INSTALL=true, the switch action.yml documents for runner images
that ship gatekeeper, and use what that install put there. A bait wheel ("torch 99")
shows that the pip constraint, not luck, keeps the runner's torch.

The flow test talks to moto's S3 server (``s3_bucket_uri``) and the fake GitHub API
(``github_api``) and compiles a tiny model for real.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from github_server import FakeGitHub
from helpers import TINY_MODEL, parity_only_config, write_project

ROOT = Path(__file__).resolve().parents[1]
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


def test_expression_subset_follows_github_rules() -> None:
    ctx = {
        "inputs": {"comment": "true", "fail-on-regression": "False"},
        "steps": {"gk": {"outputs": {"report": "/tmp/r.md", "cache-hit": "true"}}},
        "github": {"event_name": "pull_request"},
    }
    fns = {
        "success": lambda: True,
        "failure": lambda: False,
        "always": lambda: True,
        "cancelled": lambda: False,
    }

    def ev(text: str) -> Any:
        return Expr.evaluate(text, ctx, fns)

    assert ev("inputs.comment == 'true'") is True
    assert ev("inputs.fail-on-regression == 'false'") is True  # strings ignore case
    assert ev("steps.gk.outputs.report != ''") is True
    assert ev("steps.gk.outputs.missing != ''") is False  # null coerces like ''
    assert ev("steps.nope.outputs.x") is None
    assert ev("steps.gk.outputs.cache-hit") == "true"
    assert ev("!(github.event_name == 'push') && 'a' || 'b'") == "a"
    assert ev("'it''s'") == "it's"
    assert ev("1 == '1'") is True and ev("null == 0") is True
    assert condition("inputs.comment == 'true'", ctx, {**fns, "success": lambda: False}) is False
    assert (
        condition(
            "${{ always() && inputs.comment == 'true' }}", ctx, {**fns, "success": lambda: False}
        )
        is True
    )
    assert render("a ${{ inputs.comment }} b ${{ null }}", ctx, fns) == "a true b "
    with pytest.raises(ExprError):
        ev("contains(inputs.comment, 't')")  # not in the subset: refused, not guessed
    with pytest.raises(ExprError):
        ev("secrets.TOKEN")


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


@pytest.fixture(scope="module")
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


@pytest.fixture(scope="module")
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


# ------------------------------------------------------------------------------ tests


def test_run_scripts_take_inputs_only_through_env() -> None:
    """No ``${{ }}`` inside a ``run:`` (in the action and in the example workflows): an
    input or event field can never become shell code."""
    docs = {ACTION: yaml.safe_load(ACTION.read_text())}
    docs |= {p: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "workflows").glob("*.yml"))}
    scripts = 0
    for path, doc in docs.items():
        steps = (
            doc["runs"]["steps"]
            if path == ACTION
            else [s for job in doc["jobs"].values() for s in job.get("steps", [])]
        )
        for step in steps:
            if "run" in step:
                scripts += 1
                assert "${{" not in step["run"], f"{path.name}: {step.get('name')}"
    assert scripts >= 8


@dataclass
class Installed:
    """The runner's Python after the action's install step ran in it once, for real."""

    bin: Path
    torch_before: tuple[str, str]
    run: ActionRun


@pytest.fixture(scope="module")
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
    return Installed(runner_python, before, run)


def test_install_keeps_the_runners_torch(installed: Installed, tmp_path: Path) -> None:
    python = installed.bin / "python"
    install = installed.run.step("setup")
    assert install.outcome == "success", install.log
    assert "Successfully installed gatekeeper" in install.log
    assert f"torch: {installed.torch_before[0]}" in install.log
    assert _torch_of(python) == installed.torch_before  # same version, same files
    site = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            text=True,
        ).strip()
    )
    assert not list(site.glob("torch*")), "pip installed a torch of its own"
    where = subprocess.check_output(
        [str(python), "-c", "import gatekeeper; print(gatekeeper.__file__)"],
        text=True,
        cwd=tmp_path,
    )  # not this repository's folder
    assert Path(where.strip()).is_relative_to(site)  # the action's copy, not the editable one
    assert install.outputs["python"] == str(python)
    # the absent config is a usage error: exit 2, and the step fails
    assert installed.run.step("gatekeeper").outputs["exit-code"] == "2"
    assert installed.run.step("Verdict").returncode == 2
    assert installed.run.outcome == "failure"


def _fake_torch_wheel(folder: Path, version: str) -> Path:
    """A wheel that calls itself torch ``version``: bait for a pip that would upgrade."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"torch-{version}.dist-info"
    files = {
        "torch/__init__.py": f"__version__ = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    wheel = folder / f"torch-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return wheel


def test_install_refuses_to_replace_torch(action_dir: Path, tmp_path: Path) -> None:
    """A gatekeeper that wants a newer torch, with one on offer: pip never resolves
    torch (the pinned dependencies and gatekeeper go in with --no-deps), and the step
    fails, naming torch, rather than run with a torch gatekeeper does not take."""
    action = tmp_path / "action"
    shutil.copytree(action_dir, action, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    pyproject = action / "pyproject.toml"
    assert '"torch>=2.6"' in pyproject.read_text()
    pyproject.write_text(pyproject.read_text().replace('"torch>=2.6"', '"torch>=99"'))
    offers = tmp_path / "wheels"
    _fake_torch_wheel(offers, "99.0.0")
    bin_dir = _layered_venv(tmp_path / "venv", with_parent_packages=True)
    before = _torch_of(bin_dir / "python")
    env = _runner_env(bin_dir) | {
        "PIP_CONFIG_FILE": os.devnull,  # no machine-wide pip settings (or constraints)
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(offers),  # only the bait on offer
        "PIP_NO_BUILD_ISOLATION": "0",
    }  # build with this venv's setuptools: no network
    runner = CompositeRunner(action, tmp_path, tmp_path, env)
    run = runner.run(
        {"command": "compile", "config": "absent.toml", "comment": "false"},
        github={"event_name": "push", "repository": REPO, "token": ""},
    )
    install = run.step("setup")
    assert install.returncode == 2, install.log
    assert f"never replaces torch {before[0]}" in install.log
    assert "torch>=99" in install.log  # pip check names the conflict
    assert _torch_of(bin_dir / "python") == before
    assert run.outcome == "failure"


def test_install_without_torch_fails_clearly(action_dir: Path, tmp_path: Path) -> None:
    bare = _layered_venv(tmp_path / "bare", with_parent_packages=False)
    runner = CompositeRunner(action_dir, tmp_path, tmp_path, _runner_env(bare))
    run = runner.run(
        {"command": "run"}, github={"event_name": "push", "repository": REPO, "token": ""}
    )
    assert run.outcome == "failure"
    install = run.step("setup")
    assert install.returncode == 2
    assert "torch is not installed" in install.log and "never installs torch" in install.log
    assert [s.outcome for s in run.steps[1:]] == ["skipped"] * (len(run.steps) - 1)
    assert "Successfully installed" not in install.log


def test_a_gatekeeper_folder_in_the_workspace_does_not_shadow_the_tool(
    installed: Installed, action_dir: Path, tmp_path: Path
) -> None:
    workspace = write_project(tmp_path / "workspace", TINY_MODEL, CONFIG)
    decoy = workspace / "gatekeeper"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise SystemExit('the decoy gatekeeper ran')\n")
    (decoy / "github.py").write_text("raise SystemExit('the decoy gatekeeper ran')\n")
    env = _runner_env(installed.bin) | {"GATEKEEPER_ACTION_SKIP_INSTALL": "true"}
    runner = CompositeRunner(action_dir, workspace, tmp_path, env)
    run = runner.run(
        {"command": "warm"}, github={"event_name": "push", "repository": REPO, "token": ""}
    )
    assert run.outcome == "success", run.log
    assert "decoy" not in run.log
    assert "read-only: auto -> false" in run.log  # the event was read by the real module
    assert run.outputs["cache-hit"] == "false"  # an empty store: a miss, not an error


def test_the_install_runs_an_isolated_pip_from_an_empty_folder(
    action_dir: Path, tmp_path: Path
) -> None:
    """A pull request's checkout is the workspace: a ``pip/`` or ``setuptools/`` folder
    there, or on PYTHONPATH, must not run in the place of pip while the step holds the
    token and the signing key."""
    workspace = write_project(tmp_path / "workspace", TINY_MODEL, CONFIG)
    ran = tmp_path / "decoy-ran"
    for name in ("pip", "setuptools"):
        decoy = workspace / name
        decoy.mkdir()
        code = f"open({str(ran)!r}, 'a').write({name!r})\n"
        (decoy / "__init__.py").write_text(code)
        (decoy / "__main__.py").write_text(code)
    bin_dir = _layered_venv(tmp_path / "venv", with_parent_packages=True)
    runner = CompositeRunner(action_dir, workspace, tmp_path, _runner_env(bin_dir))
    run = runner.run(
        {"command": "warm", "signing-key": SIGNING_KEY, "comment": "false"},
        github={"event_name": "push", "repository": REPO, "token": ""},
        job_env={"PYTHONPATH": str(workspace)},
    )
    install = run.step("setup")
    assert install.outcome == "success", install.log
    assert not ran.exists(), ran.read_text()
    assert "Successfully installed gatekeeper" in install.log


def test_the_install_takes_only_hash_pinned_dependencies(action_dir: Path, tmp_path: Path) -> None:
    """What runs with the signing key is pinned by the action's commit: its
    dependencies come from requirements/pinned.txt, each with its hashes; a requirement
    there without them fails the install (no floating ``>=`` ranges fetched)."""
    action = tmp_path / "action"
    shutil.copytree(action_dir, action, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    pinned = action / "requirements" / "pinned.txt"
    assert "--hash=sha256:" in pinned.read_text()
    pinned.write_text(pinned.read_text() + "six==1.16.0\n")  # not installed, no hash
    bin_dir = _layered_venv(tmp_path / "venv", with_parent_packages=True)
    runner = CompositeRunner(action, tmp_path, tmp_path, _runner_env(bin_dir))
    run = runner.run(
        {"command": "warm", "comment": "false"},
        github={"event_name": "push", "repository": REPO, "token": ""},
    )
    install = run.step("setup")
    assert install.returncode == 2, install.log
    assert "pinned dependencies" in install.log and "six" in install.log
    assert "Successfully installed gatekeeper" not in install.log


def test_require_signature_without_a_key_fails_before_anything_runs(
    installed: Installed, action_dir: Path, tmp_path: Path
) -> None:
    env = _runner_env(installed.bin) | {"GATEKEEPER_ACTION_SKIP_INSTALL": "true"}
    runner = CompositeRunner(action_dir, tmp_path, tmp_path, env)
    github = {"event_name": "push", "repository": REPO, "token": ""}
    run = runner.run({"command": "warm", "require-signature": "true"}, github=github)
    assert run.step("setup").returncode == 2
    assert "require-signature is true but signing-key is empty" in run.step("setup").log
    assert run.outcome == "failure"
    run = runner.run({"command": "warm", "require-signature": "maybe"}, github=github)
    assert "require-signature must be true or false" in run.step("setup").log


def test_gate_flow_outputs_summary_sticky_comment_and_failures(
    harness: Harness, github_api: FakeGitHub, s3_bucket_uri: Any, tmp_path: Path
) -> None:
    store = str(s3_bucket_uri)
    workspace = harness.runner.workspace

    # 1. a push to main publishes signed bundles and main's baseline
    base = harness.push({"command": "baseline", "store": store, "signing-key": SIGNING_KEY})
    assert base.outcome == "success", base.log
    assert base.outputs["verdict"] == "no-baseline"
    assert base.outputs["cache-hit"] == "true"
    assert Path(base.outputs["results"]).is_file() and Path(base.outputs["report"]).is_file()
    assert "gatekeeper: no-baseline" in base.summary
    assert SIGNING_KEY in base.masks and WRITE_TOKEN in base.masks
    assert not [
        line
        for line in base.log.splitlines()
        if SIGNING_KEY in line and not line.startswith("::add-mask::")
    ]
    keys = _bucket_keys(s3_bucket_uri)
    assert any(k.startswith("gk/bundles/tiny/b4/default/") for k in keys)
    assert any(
        k.startswith("gk/baselines/tiny/b4/default/") and k.endswith("/main/latest.json")
        for k in keys
    )
    assert "not a pull request event" in base.step("Comment on the pull request").log
    assert "GATEKEEPER_ACTION_SKIP_INSTALL=true" in base.step("setup").log

    # 2. a deploy warms its cache from the signed bundles
    cache = tmp_path / "inductor-cache"
    warm = harness.push(
        {"command": "warm", "store": store, "signing-key": SIGNING_KEY, "read-only": "true"},
        job_env={"TORCHINDUCTOR_CACHE_DIR": str(cache)},
    )
    assert warm.outcome == "success", warm.log
    assert warm.outputs["cache-hit"] == "true"
    assert warm.outputs["verdict"] == "" and warm.outputs["report"] == ""
    assert any(cache.rglob("*")), "warm restored nothing"
    assert warm.step("Comment on the pull request").outcome == "skipped"

    # 3. a pull request with the same model passes and gets one sticky comment
    first = harness.pull_request({"store": store})
    assert first.outcome == "success", first.log
    assert "read-only: auto -> false" in first.step("gatekeeper").log
    assert first.outputs["verdict"] in ("pass", "improved")
    assert first.outputs["cache-hit"] == "true"
    report = Path(first.outputs["report"]).read_text()
    results = json.loads(Path(first.outputs["results"]).read_text())
    assert [t["target"] for t in results["targets"]] == ["tiny/b4/default"]
    assert report.strip() and report.strip() in first.summary
    (comment,) = github_api.comments_on(REPO, PR)
    assert comment["body"] == f"{MARKER}\n{report}"
    assert comment["user"]["login"] == "github-actions[bot]"

    # 3b. `command: merge` gates shard results folders (here: that run's, as one shard,
    #     laid out as download-artifact lays out several artifacts)
    shards = tmp_path / "shards"
    shutil.copytree(Path(first.outputs["results"]).parent, shards / "gatekeeper-shard-1")
    merged = harness.pull_request(
        {"command": "merge", "merge-from": str(shards), "store": store, "comment": "false"}
    )
    assert merged.outcome == "success", merged.log
    assert "merging 1 shard(s)" in merged.step("gatekeeper").log
    assert merged.outputs["verdict"] == first.outputs["verdict"]
    assert (
        json.loads(Path(merged.outputs["results"]).read_text())["targets"][0]["target"]
        == "tiny/b4/default"
    )
    (shards / "empty").mkdir()
    nothing = harness.pull_request(
        {
            "command": "merge",
            "merge-from": str(shards / "empty"),
            "comment": "false",
            "fail-on-regression": "false",
        }
    )
    assert nothing.outcome == "failure"
    assert "no shard results" in nothing.step("gatekeeper").log

    # 4. a PR whose outputs drifted: the gate fails, the comment is still updated (in
    #    place), then the step fails
    (workspace / "tinymodel.py").write_text(DRIFTED_MODEL)
    failing = harness.pull_request({"store": store})
    assert failing.outcome == "failure"
    assert failing.outputs["verdict"] == "parity-failed"
    assert failing.step("gatekeeper").outcome == "success"  # recorded, not failed
    assert failing.step("gatekeeper").outputs["exit-code"] == "1"
    assert failing.step("Comment on the pull request").outcome == "success"
    assert failing.step("Verdict").outcome == "failure"
    assert failing.step("Verdict").returncode == 1
    assert any("parity-failed" in a for a in failing.annotations("error"))
    (updated,) = github_api.comments_on(REPO, PR)
    assert updated["id"] == comment["id"]
    assert "parity-failed" in updated["body"]
    assert updated["body"] == f"{MARKER}\n{Path(failing.outputs['report']).read_text()}"

    # 5. the same from a fork: read-only token and store; fail-on-regression false keeps
    #    exit 1 from failing the step; the comment is skipped, saying who will post it
    keys_before = _bucket_keys(s3_bucket_uri)
    fork = harness.pull_request(
        {"store": store, "fail-on-regression": "false"},
        head_repo="mallory/models",
        token=READ_TOKEN,
    )
    assert fork.outcome == "success", fork.log
    assert fork.outputs["verdict"] == "parity-failed"
    assert "read-only: auto -> true" in fork.step("gatekeeper").log
    comment_log = fork.step("Comment on the pull request").log
    assert "comment skipped" in comment_log and "fork-comment.yml" in comment_log
    assert "Traceback" not in fork.log
    assert any("fail-on-regression: false" in a for a in fork.annotations("warning"))
    assert github_api.comments_on(REPO, PR) == [updated]
    assert _bucket_keys(s3_bucket_uri) == keys_before

    # 6. an error (exit 2) fails the step even with fail-on-regression false
    broken = harness.pull_request(
        {"store": store, "config": "missing.toml", "fail-on-regression": "false"}
    )
    assert broken.outcome == "failure"
    assert broken.step("gatekeeper").outputs["exit-code"] == "2"
    assert broken.step("Verdict").returncode == 2
    assert broken.step("Comment on the pull request").outcome == "skipped"
    assert broken.outputs["verdict"] == ""
    assert github_api.comments_on(REPO, PR) == [updated]


# ------------------------------------------------------- the base commit, and acceptance


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    ).stdout.strip()


def _has_commit(repo: Path, sha: str) -> bool:
    return (
        subprocess.run(
            ["git", "-C", str(repo), "cat-file", "-e", f"{sha}^{{commit}}"],
            check=False,
            capture_output=True,
        ).returncode
        == 0
    )


@dataclass
class Origin:
    """The repository on the server (a bare one, reached by file://): main, and the pull
    request's branch one commit ahead (the model unchanged, so its bundles are main's)."""

    url: str
    main: str
    feature: str

    def clone(self, dest: Path, branch: str) -> Path:
        """What actions/checkout does by default: depth 1, that one commit only."""
        git(
            dest.parent,
            "clone",
            "-q",
            "--depth=1",
            "--branch",
            branch,
            "--single-branch",
            self.url,
            str(dest),
        )
        return dest


@pytest.fixture
def origin(tmp_path: Path) -> Origin:
    src = write_project(tmp_path / "src", TINY_MODEL, CONFIG)
    git(src, "init", "-q", "-b", "main")
    git(src, "add", ".")
    git(src, "commit", "-qm", "main")
    git(src, "checkout", "-qb", "feature")
    (src / "NOTES.md").write_text("the pull request's change\n")
    git(src, "add", ".")
    git(src, "commit", "-qm", "feature")
    bare = tmp_path / "origin.git"
    git(tmp_path, "clone", "-q", "--bare", str(src), str(bare))
    return Origin(
        f"file://{bare}", git(bare, "rev-parse", "main"), git(bare, "rev-parse", "feature")
    )


def test_a_depth_1_pull_request_checkout_pairs_with_the_fetched_base(
    harness: Harness, origin: Origin, tmp_path: Path
) -> None:
    """What a default actions/checkout leaves (the PR's commit, depth 1) is enough: the
    action fetches the event's base.sha, and gatekeeper measures base and PR in one
    process (paired), against a store that holds main's baseline."""
    store = str(tmp_path / "store")
    main = harness.at(origin.clone(tmp_path / "main-checkout", "main"))
    base = main.push({"command": "baseline", "store": store})
    assert base.outcome == "success", base.log
    assert "nothing to fetch" in base.step("base").log  # a push names no base commit

    workspace = origin.clone(tmp_path / "pr-checkout", "feature")
    assert git(workspace, "rev-parse", "--is-shallow-repository") == "true"
    assert not _has_commit(workspace, origin.main)
    event = _pull_request_event(REPO, base_sha=origin.main, head_sha=origin.feature)
    run = harness.at(workspace).pull_request({"store": store, "comment": "false"}, event=event)
    assert run.outcome == "success", run.log
    fetch = run.step("base")
    assert fetch.outcome == "success" and fetch.outputs.get("fetched") == "true", fetch.log
    assert f"fetched the base commit {origin.main}" in fetch.log
    assert not [a for a in run.annotations("warning") if "base commit" in a], run.log
    assert _has_commit(workspace, origin.main)  # really fetched, and still shallow
    assert git(workspace, "rev-parse", "--is-shallow-repository") == "true"
    assert "--mode auto" in run.step("gatekeeper").log
    results = json.loads(Path(run.outputs["results"]).read_text())
    assert results["mode"] == "paired", results.get("mode_reason")
    assert origin.main[:12] in results["mode_reason"]
    (target,) = results["targets"]
    assert target["paired"]["base_commit"] == origin.main
    report = Path(run.outputs["report"]).read_text()
    assert "paired with" in report and origin.main[:12] in report
    assert run.outputs["verdict"] in ("pass", "improved")
    assert len(git(workspace, "worktree", "list").splitlines()) == 1  # the base's is gone


def test_the_gatekeeper_accept_label_accepts_a_regression(
    harness: Harness, github_api: FakeGitHub, tmp_path: Path
) -> None:
    """A PR whose model does more FLOPs (the deterministic work rule) and carries the label
    gatekeeper:accept: verdict accepted, exit 0, the comment says so. Re-gated (merge)
    without the label it is regressed again; gatekeeper:accept:<glob> and the `accept`
    input accept only matching targets. This workspace is no git checkout: the action says
    it cannot fetch the base, and gatekeeper measures in stored mode and says why."""
    store = str(tmp_path / "store")
    workspace = harness.runner.workspace
    base = harness.push({"command": "baseline", "store": store, "comment": "false"})
    assert base.outcome == "success", base.log

    (workspace / "tinymodel.py").write_text(HEAVIER_MODEL)
    accepted = harness.pull_request(
        {"store": store},
        event=_pull_request_event(REPO, labels=("perf", "gatekeeper:accept"), action="labeled"),
    )
    assert accepted.outcome == "success", accepted.log
    assert accepted.outputs["verdict"] == "accepted"
    assert accepted.step("gatekeeper").outputs["exit-code"] == "0"
    (warning,) = [a for a in accepted.annotations("warning") if "base commit" in a]
    assert warning.startswith("::warning title=gatekeeper::cannot fetch the pull request's")
    assert "not in a git checkout" in warning
    results = json.loads(Path(accepted.outputs["results"]).read_text())
    assert results["mode"] == "stored" and "cannot pair" in results["mode_reason"]
    report = Path(accepted.outputs["report"]).read_text()
    assert "accepted" in report and "FLOPs per call" in report
    assert "stored mode: cannot pair" in report
    (comment,) = github_api.comments_on(REPO, PR)
    assert comment["body"] == f"{MARKER}\n{report}"

    # the same results, gated again the way matrix-gate.yml's merge job does
    shards = tmp_path / "shards"
    shutil.copytree(Path(accepted.outputs["results"]).parent, shards / "gatekeeper-shard-1")

    def merge(labels: tuple[str, ...], **inputs: str) -> ActionRun:
        return harness.pull_request(
            {
                "command": "merge",
                "merge-from": str(shards),
                "store": store,
                "comment": "false",
                **inputs,
            },
            event=_pull_request_event(REPO, labels=labels),
        )

    unlabelled = merge(())
    assert unlabelled.outcome == "failure"
    assert unlabelled.outputs["verdict"] == "regressed"
    assert unlabelled.step("Verdict").returncode == 1
    assert "FLOPs per call" in Path(unlabelled.outputs["report"]).read_text()
    other = merge(("gatekeeper:accept:other/*",))
    assert other.outputs["verdict"] == "regressed" and other.outcome == "failure"
    matching = merge(("gatekeeper:accept:tiny/*",))
    assert matching.outputs["verdict"] == "accepted" and matching.outcome == "success"
    by_input = merge((), accept="other/*\n  tiny/b4/*")
    assert by_input.outcome == "success", by_input.log
    assert by_input.outputs["verdict"] == "accepted"
    assert "--accept=other/* --accept=tiny/b4/*" in by_input.step("gatekeeper").log


class _Recorder(BaseHTTPRequestHandler):
    """A git server that is not there: records what it was sent, answers 404."""

    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).seen.append({"path": self.path, **dict(self.headers.items())})
        self.send_error(404)

    def log_message(self, *args: Any) -> None:
        pass


def test_the_base_fetch_never_fails_the_job(
    harness: Harness, origin: Origin, tmp_path: Path
) -> None:
    """Each way the fetch can fail is one warning line, and the run goes on (here to a
    quick usage error: the config is absent, so nothing is compiled)."""
    quick = {"config": "absent.toml", "comment": "false"}

    def fetch_step(
        workspace: Path, event: dict[str, Any], inputs: dict[str, str] = quick, **kw: Any
    ) -> StepRun:
        run = harness.at(workspace).pull_request(inputs, event=event, **kw)
        assert run.step("gatekeeper").outputs["exit-code"] == "2", run.log  # it went on
        return run.step("base")

    # a base commit the server does not have (a fork whose base is unreachable)
    shallow = origin.clone(tmp_path / "shallow", "feature")
    missing = "f" * 40
    step = fetch_step(shallow, _pull_request_event("mallory/models", base_sha=missing))
    assert step.outcome == "success" and "fetched" not in step.outputs
    (warning,) = [line for line in step.log.splitlines() if line.startswith("::")]
    assert warning.startswith("::warning title=gatekeeper::cannot fetch")
    assert f"git fetch origin {missing} failed" in warning

    # a checkout without a remote
    lonely = write_project(tmp_path / "lonely", TINY_MODEL, CONFIG)
    git(lonely, "init", "-q", "-b", "feature")
    git(lonely, "add", ".")
    git(lonely, "commit", "-qm", "x")
    step = fetch_step(lonely, _pull_request_event(REPO, base_sha=origin.main))
    assert "has no remote 'origin'" in step.log and step.outcome == "success"

    # an event whose base.sha is no commit id is never handed to git
    step = fetch_step(shallow, _pull_request_event(REPO, base_sha="--upload-pack=touch x"))
    assert "is not a commit id" in step.log and not (shallow / "x").exists()

    # mode stored: nothing is fetched
    run = harness.at(shallow).pull_request(
        {**quick, "mode": "stored"}, event=_pull_request_event(REPO, base_sha=origin.main)
    )
    assert run.step("base").outcome == "skipped"
    assert "--mode stored" in run.step("gatekeeper").log
    assert not _has_commit(shallow, origin.main)

    # checkout's persist-credentials: false leaves no credentials: the fetch from this
    # GitHub server authenticates with the action's token, through git's environment only
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        git(shallow, "remote", "set-url", "origin", f"{url}/{REPO}.git")
        config_before = (shallow / ".git" / "config").read_text()
        step = fetch_step(shallow, _pull_request_event(REPO, base_sha=origin.main), server_url=url)
    finally:
        server.shutdown()
        server.server_close()
    assert step.outcome == "success" and "failed" in step.log
    (request, *_) = _Recorder.seen
    assert request["path"].startswith(f"/{REPO}.git/info/refs")
    basic = base64.b64encode(f"x-access-token:{WRITE_TOKEN}".encode()).decode()
    assert {k.lower(): v for k, v in request.items()}["authorization"] == f"basic {basic}"
    assert WRITE_TOKEN not in step.log
    assert f"::add-mask::{basic}" in step.log
    assert [line for line in step.log.splitlines() if basic in line] == [f"::add-mask::{basic}"]
    assert (shallow / ".git" / "config").read_text() == config_before  # nothing persisted


def test_bad_input_values_are_refused(action_dir: Path, tmp_path: Path) -> None:
    python_bin = Path(sys.executable).parent  # refused before any Python runs
    runner = CompositeRunner(action_dir, tmp_path, tmp_path, _runner_env(python_bin))
    run = runner.run({"command": "rm -rf /"}, github={"event_name": "push", "token": ""})
    assert run.outcome == "failure"
    assert run.step("setup").returncode == 2
    assert "command must be run, baseline, compile, warm or merge" in run.step("setup").log
    run = runner.run({"mode": "fast"}, github={"event_name": "push", "token": ""})
    assert run.step("setup").returncode == 2
    assert "mode must be auto, paired or stored" in run.step("setup").log
