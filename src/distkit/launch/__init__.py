"""The public entry points (``run``, ``launch_function``, ``launch_script``), the checks
before a run may start, the one process supervisor, rendezvous, ``distkit launch``'s ranks."""


def __getattr__(name):
    # `distkit.launch` was one module before it became a room: its names stay reachable here
    if name.startswith("__"):
        raise AttributeError(name)
    import importlib
    return getattr(importlib.import_module(__name__ + ".entry"), name)
