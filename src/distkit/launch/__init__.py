"""The public entry points (``run``, ``launch_function``, ``launch_script``), the checks
before a run may start, the one process supervisor, rendezvous, ``distkit launch``'s ranks."""


def __getattr__(name):
    # `from distkit.launch import NAME` is public (docs/architecture.md, "Public names")
    if name.startswith("__"):
        raise AttributeError(name)
    import importlib
    return getattr(importlib.import_module(__name__ + ".entry"), name)
