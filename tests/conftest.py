"""Shared fixtures. Service fixtures live in their own modules, loaded as plugins."""

pytest_plugins = ["support.s3_server", "support.github_server"]
