"""The action's fixtures (tests/support/action_runner.py): its folder as the runner
downloads it, the runner's Python, the install step run once, and a harness."""

from support.action_runner import action_dir, harness, installed, runner_python  # noqa: F401
