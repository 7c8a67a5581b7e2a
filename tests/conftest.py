"""Shared fixtures. Service fixtures live in their own modules, loaded as plugins."""

pytest_plugins = ["s3_server", "github_server"]
