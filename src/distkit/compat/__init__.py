"""Version shims between ignite, torch and torch_xla (``shims``), each applied only where
needed, and the facts about TPUs they rely on."""


def __getattr__(name):
    # `from distkit.compat import NAME` is public (docs/architecture.md, "Public names")
    if name.startswith("__"):
        raise AttributeError(name)
    import importlib
    return getattr(importlib.import_module(__name__ + ".shims"), name)
