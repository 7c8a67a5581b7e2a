"""Shard 1 of 4 of the README tour's 39 example targets, compiled and warmed:
tests/support/example_config.py says what each test holds and why four files."""

from support.example_config import shard_tests

globals().update(shard_tests(1))


def test_the_config_has_the_39_targets_the_readme_tours():
    from support.example_config import ALL, CONFIG, SHARDS

    from gatekeeper.project import expand, load_config
    from gatekeeper.targets import select

    assert len(ALL) == 39 == len(set(ALL)), ALL
    shards = [select(expand(load_config(CONFIG)), shard=f"{i}/{SHARDS}") for i in range(1, 5)]
    assert sorted(t.id for s in shards for t in s) == sorted(ALL)  # each in one shard
