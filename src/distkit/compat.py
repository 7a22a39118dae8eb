"""Version shims between ignite, torch and torch_xla, each applied only where needed.

``apply()`` runs on ``import distkit``.
"""
from __future__ import annotations


def apply() -> list[str]:
    """Apply every shim this environment needs; return the names of those applied."""
    return []
