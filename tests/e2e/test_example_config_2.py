"""Shard 2 of 4 of the README tour's 39 example targets, compiled and warmed:
tests/support/example_config.py says what each test holds and why four files."""

from support.example_config import shard_tests

globals().update(shard_tests(2))
