"""The core's layers (DESIGN.md, "The core — layers, imports one way")."""
from __future__ import annotations

import subprocess
import sys

from conftest import subprocess_env


def test_machine_module_imports_no_torch_or_ignite():
    code = ("import sys, distkit.machine; "
            "print(sorted(m for m in ('torch', 'ignite') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], env=subprocess_env(), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout
