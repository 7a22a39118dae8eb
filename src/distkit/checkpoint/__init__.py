"""Checkpoints and run folders: the saver and its checksums, resume, the run folder a run
writes to."""


def __getattr__(name):
    # `from distkit.checkpoint import NAME` is public (docs/architecture.md, "Public names")
    if name.startswith("__"):
        raise AttributeError(name)
    import importlib
    return getattr(importlib.import_module(__name__ + ".saver"), name)
