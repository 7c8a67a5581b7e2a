"""gatekeeper: make torch.compile safe and fast to ship."""

__version__ = "0.1.0"

__all__ = ["__version__", "device_mesh", "load_aot", "warm_start"]


def warm_start(*args, **kwargs):  # documented in gatekeeper.warm
    from .warm import warm_start as _warm_start

    return _warm_start(*args, **kwargs)


warm_start.__doc__ = "Restore compiled artifacts for this process; see gatekeeper.warm.warm_start."


def load_aot(*args, **kwargs):  # documented in gatekeeper.runtime
    from .runtime import load_aot as _load_aot

    return _load_aot(*args, **kwargs)


load_aot.__doc__ = "The installed AOTInductor package of a target; see gatekeeper.runtime.load_aot."


def device_mesh():  # documented in gatekeeper.runtime
    from .runtime import device_mesh as _device_mesh

    return _device_mesh()


device_mesh.__doc__ = (
    "A distributed model's device mesh, as its config's distributed.mesh names it; "
    "see gatekeeper.runtime.device_mesh."
)
