"""One module per CLI verb; each has ``register(subparsers, parents)`` and ``run(ctx)``."""
