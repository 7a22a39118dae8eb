"""Version shims between ignite, torch and torch_xla (``shims``), each applied only where
needed, and the facts about TPUs they rely on."""


def __getattr__(name):
    # `distkit.compat` was one module before it became a room: its names stay reachable here
    if name.startswith("__"):
        raise AttributeError(name)
    import importlib
    return getattr(importlib.import_module(__name__ + ".shims"), name)
