"""gatekeeper's quick start: one model compiled cold, a deploy warm-started from the
store, and a pull request gated against main.

    python examples/quickstart.py [--dir DIR] [--change slower|numerics ...]

It copies examples/quickstart/ (a gatekeeper.toml and a model.py) into a scratch git
repository (a new temporary folder, or --dir) whose `main` branch holds it, and runs the
real CLI there, printing each command before it runs it:

1. `gatekeeper compile`: compiles the model cold in a fresh process and publishes its
   bundle to the local store (.gatekeeper/store in the scratch folder);
2. `gatekeeper run --publish --out main`: main's CI job: measures main, verifies the
   bundle's precompiled package, and publishes main's baseline;
3. `gatekeeper warm --probe --cache-dir deploy-cache`: a deploy restores the bundle into
   an empty cache dir, and a fresh process makes its first compiled call from it;
4. a pull request branch changes the model and `gatekeeper run --out pr` gates it,
   paired with main's commit: --change slower (the default) adds a layer that leaves
   the outputs unchanged but costs work on every call; --change numerics switches an
   activation from GELU to ReLU, which changes the outputs. --change given more than
   once gates each change in turn, each on its own branch from main, after the same
   steps 1-3 (its report in pr-<change>/ instead of pr/).

Nothing outside the scratch folder is written. Exit 0 when the gate caught every
change, 1 when it did not, 2 when a command failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NoReturn

PROJECT = Path(__file__).resolve().parent / "quickstart"

# Each change: what the pull request does, why it matters, and its edits to model.py.
CHANGES: dict[str, tuple[str, str, list[tuple[str, str]]]] = {
    "slower": (
        "adds a residual adapter layer, zero-initialised",
        "the outputs stay exactly the same; every call does more work",
        [
            (
                "        self.head = nn.Linear(d_hidden, classes)\n",
                "        self.head = nn.Linear(d_hidden, classes)\n"
                "        self.adapter = nn.Linear(d_hidden, d_hidden)  # starts as a no-op\n"
                "        nn.init.zeros_(self.adapter.weight)\n"
                "        nn.init.zeros_(self.adapter.bias)\n",
            ),
            (
                "        h = nn.functional.gelu(self.fc2(h))\n",
                "        h = nn.functional.gelu(self.fc2(h))\n        h = h + self.adapter(h)\n",
            ),
        ],
    ),
    "numerics": (
        "switches the second activation from GELU to ReLU",
        "ReLU is cheaper, and the outputs change",
        [
            (
                "        h = nn.functional.gelu(self.fc2(h))\n",
                "        h = nn.functional.relu(self.fc2(h))\n",
            )
        ],
    ),
}

TOUR = "python benchmarks/tour.py --config examples/gatekeeper.toml --processes 1"
START = time.monotonic()


def fail(message: str) -> NoReturn:
    """A set-up or command failure: one line on stderr, exit 2."""
    print(message, file=sys.stderr, flush=True)
    sys.exit(2)


def say(text: str = "") -> None:
    print(text, flush=True)


STEPS = [4]  # steps in all: 3 + one per change


def step(n: int, title: str) -> None:
    took = int(time.monotonic() - START)
    say(f"\n[{took // 60}:{took % 60:02d}] {n}/{STEPS[0]} {title}")


def git(repo: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", "-c", "user.name=quickstart", "-c", "user.email=quickstart@localhost", *args],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        fail(f"quickstart: git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def child_env() -> dict[str, str]:
    """The environment the CLI runs in: without GitHub's variables, so that a quick start
    run inside a CI job neither reads that job's pull request nor writes its summary."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}


def gatekeeper(repo: Path, *args: str, ok: tuple[int, ...] = (0,)) -> tuple[int, dict]:
    """Run one gatekeeper command in the scratch repository, its progress (stderr)
    shown as it comes, its --json document returned."""
    say("  $ gatekeeper " + " ".join(args))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gatekeeper", *args, "--json"],
        cwd=repo,
        env=child_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    err = proc.stderr
    lines: list[str] = []

    def forward() -> None:
        for line in err:
            lines.append(line)
            sys.stderr.write("    " + line)
            sys.stderr.flush()

    forwarder = threading.Thread(target=forward, daemon=True)
    forwarder.start()
    out = proc.stdout.read()
    code = proc.wait()
    forwarder.join()
    if code not in ok:
        tail = "".join(lines[-5:]).strip()
        fail(f"quickstart: `gatekeeper {' '.join(args)}` exited {code}: {tail}")
    return code, json.loads(out) if out.strip() else {}


def seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f} s" if x >= 10 else f"{x:.2f} s"


def set_up(folder: Path) -> Path:
    if folder.exists() and any(folder.iterdir()):
        fail(f"quickstart: {folder} is not empty: name a new folder with --dir")
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(
        PROJECT, folder, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
    )
    (folder / ".gitignore").write_text(
        ".gatekeeper/\ndeploy-cache/\nmain/\npr/\npr-*/\n__pycache__/\n"
    )
    git(folder, "init", "-q", "-b", "main")
    git(folder, "add", ".")
    git(folder, "commit", "-qm", "A classifier, gated by gatekeeper")
    return folder


def change_model(repo: Path, change: str) -> None:
    """Apply the pull request's edits to model.py on a new branch from main and commit
    them."""
    summary, _, edits = CHANGES[change]
    git(repo, "checkout", "-qb", f"pr-{change}", "main")
    model = repo / "model.py"
    text = model.read_text()
    for old, new in edits:
        if old not in text:
            fail(f"quickstart: examples/quickstart/model.py no longer has {old.strip()!r}")
        text = text.replace(old, new)
    model.write_text(text)
    git(repo, "commit", "-qam", f"Classifier: {summary}")


def pull_request(repo: Path, target: str, change: str, n: int, out: str) -> dict:
    """Step ``n``: a pull request making ``change``, gated paired with main's commit
    (report in ``out``); its report row."""
    summary, why, _ = CHANGES[change]
    step(n, f"A pull request {summary}")
    change_model(repo, change)
    say(f"  ({why}; branch pr-{change})")
    for line in git(repo, "diff", "main", "--", "model.py").splitlines():
        if line[:1] in ("+", "-") and line[:3] not in ("+++", "---"):
            say("    " + line)
    code, doc = gatekeeper(repo, "run", "--out", out, ok=(0, 1))
    row = doc["targets"][0]
    because = ". Why:" if row["reasons"] else ""
    say(f"  -> {target}: {row['verdict']} (exit {code}), paired with main's commit{because}")
    for reason in row["reasons"]:
        say(f"     - {reason}")
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, help="scratch folder (default: a new temporary one)")
    ap.add_argument(
        "--change",
        choices=sorted(CHANGES),
        action="append",
        help="the pull request's change (default slower); repeat to gate several",
    )
    args = ap.parse_args()
    changes = list(dict.fromkeys(args.change or ["slower"]))
    STEPS[0] = 3 + len(changes)
    if shutil.which("git") is None:
        fail("quickstart: git is needed (the pull request is a branch of a scratch repo)")
    for module, install in (
        ("torch", "pip install torch==2.13.0"),
        ("gatekeeper", "pip install -e ."),
    ):
        if importlib.util.find_spec(module) is None:
            fail(f"quickstart: {module} is not installed in {sys.executable} ({install})")
    folder = args.dir or Path(tempfile.mkdtemp(prefix="gatekeeper-quickstart-"))
    repo = set_up(folder.resolve())
    say("gatekeeper quick start: one model compiled cold, a deploy warm-started from the")
    say("store, and a pull request gated against main (progress on stderr, indented).")
    say(f"Scratch project: {repo}  (a git repository: main holds examples/quickstart/)")

    step(1, "Compile the model cold and publish its bundle to the local store")
    _, doc = gatekeeper(repo, "compile")
    compiled = doc["targets"][0]
    target, cold = compiled["target"], compiled["compile_seconds"]
    say(
        f"  -> {target}: cold compile {seconds(cold)}; bundle of "
        f"{compiled['bundle_bytes'] / 1024:.0f} KiB published to .gatekeeper/store"
    )

    step(2, "Main's CI job: measure main and publish its baseline")
    _, doc = gatekeeper(repo, "run", "--publish", "--out", "main")
    row = doc["targets"][0]
    results = json.loads((repo / "main" / "results.json").read_text())["targets"][0]
    package = results.get("precompile") or {}
    say(
        f"  -> main: compiled p50 {row['p50_s']['pr'] * 1e6:.0f} µs, "
        f"{row['speedup']['pr']:.2f}x eager; published as main's baseline"
        + ("; the bundle's precompiled package verified" if package.get("verified") else "")
    )

    step(3, "Deploy: restore the bundle into an empty cache dir, first call in a new process")
    _, doc = gatekeeper(repo, "warm", "--probe", "--cache-dir", "deploy-cache")
    warm = doc["targets"][0]
    first = warm.get("first_call_seconds")
    if warm["status"] != "hit" or first is None:
        say(f"  -> {target}: {warm['status']} ({warm.get('reason') or warm.get('probe_error')})")
        return 1
    how = (
        "a verified precompiled package: Dynamo skipped"
        if warm.get("dynamo") == "skipped"
        else f"FX graph cache hits {warm['fxgraph_cache_hit']}, misses {warm['fxgraph_cache_miss']}"
    )
    say(
        f"  -> {target}: {warm['status']}; first compiled call {seconds(first)} in a new "
        f"process, against {seconds(cold)} cold: {cold / first:.1f}x faster ({how})"
    )

    out = {c: "pr" if len(changes) == 1 else f"pr-{c}" for c in changes}
    rows = [pull_request(repo, target, c, 4 + i, out[c]) for i, c in enumerate(changes)]
    took = int(time.monotonic() - START)
    say(f"\nDone in {took // 60}:{took % 60:02d}. Where to look next:")
    for path, what in (
        *(
            (
                f"{o}/report.md",
                "the pull request's report"
                + (f" (--change {c})" if len(out) > 1 else "")
                + ", as its PR comment shows it",
            )
            for c, o in out.items()
        ),
        (
            f"{out[changes[0]]}/results.json",
            f"every figure measured, per target ({out[changes[0]]}/traces: Chrome traces)",
        ),
        ("main/report.md", "main's run, now its baseline"),
        (".gatekeeper/store", "the store: bundles/ and baselines/"),
        ("deploy-cache", "the inductor cache dir the deploy was warmed into"),
    ):
        say(f"  {repo / path}\n      {what}")
    say("In the gatekeeper repository:")
    for path, what in (
        ("docs/quickstart.md", "what each step did"),
        ("docs/configuration.md", "gate your own model"),
        ("docs/action.md", "gate every pull request in GitHub Actions"),
        ("mkdocs serve", "all of docs/ as a site (after pip install -e '.[docs]')"),
        (TOUR, "the full tour: every example target (38), through every stage"),
    ):
        say(f"  {path}\n      {what}")
    missed = [
        f"{c} ({row['verdict']})"
        for c, row in zip(changes, rows, strict=True)
        if row["verdict"] not in ("regressed", "parity-failed")
    ]
    if missed:
        say(f"quickstart: the gate did not catch the change: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        fail("quickstart: interrupted")
