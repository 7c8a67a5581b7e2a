"""The ``stores`` and ``store`` fixtures (both backends) for every test of the store."""

from support.stores import store, stores  # noqa: F401
