"""The action's install step, run for real: it keeps the runner's torch, refuses to
replace it, runs an isolated pip from an empty folder, takes only hash-pinned
dependencies, and cannot be shadowed by the workspace."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from support.action_runner import (
    CONFIG,
    REPO,
    SIGNING_KEY,
    CompositeRunner,
    Installed,
    _layered_venv,
    _runner_env,
    _torch_of,
)
from support.helpers import TINY_MODEL, hash_pins, write_project


def test_install_keeps_the_runners_torch(installed: Installed, tmp_path: Path) -> None:
    """gatekeeper goes into a venv of the action's own in the job's temp dir, which sees
    the runner's torch (the same files); the runner's Python is left as it was."""
    python = installed.bin / "python"
    install = installed.run.step("setup")
    assert install.outcome == "success", install.log
    assert "Successfully installed gatekeeper" in install.log
    assert f"torch: {installed.torch_before[0]}" in install.log
    assert _torch_of(python) == installed.torch_before  # same version, same files
    runner_temp = Path(installed.run.step("setup").outputs["python"]).parents[3]
    assert runner_temp.name == "runner-temp" and python.is_relative_to(runner_temp)
    proc = subprocess.run(
        [str(installed.runner / "python"), "-c", "import gatekeeper"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )  # the runner's shared Python never gets gatekeeper (nor anything else)
    assert proc.returncode != 0 and "No module named 'gatekeeper'" in proc.stderr
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


def _offer_pins_not_installed_here(pinned: Path, folder: Path) -> None:
    """The wheels of the pinned versions this interpreter does not have, put beside the
    bait: the step below may look nowhere else (no index), and this test's venv sees
    this interpreter's packages, which follow the newest releases (a pin one release
    behind them would otherwise fail the step before it reaches torch). setuptools'
    too: the action's venv has the one ensurepip brings, which its pin replaces."""
    from importlib.metadata import PackageNotFoundError, version

    missing = []
    for name, (pin, _) in hash_pins(pinned).items():
        try:  # the action's new venv has ensurepip's own setuptools, never the pin
            if version(name) == pin and name != "setuptools":
                continue
        except PackageNotFoundError:
            pass
        missing.append(f"{name}=={pin}")
    if missing:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:"]
            + ["-d", str(folder), *missing],
            check=True,
        )


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
    _offer_pins_not_installed_here(action / "requirements" / "pinned.txt", offers)
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
