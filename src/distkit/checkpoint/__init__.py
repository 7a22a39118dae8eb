"""Checkpoints and run folders: the saver and its checksums, resume, the run folder a run
writes to."""


def __getattr__(name):
    # `distkit.checkpoint` was one module before it became a room: its names stay reachable here
    if name.startswith("__"):
        raise AttributeError(name)
    import importlib
    return getattr(importlib.import_module(__name__ + ".saver"), name)
