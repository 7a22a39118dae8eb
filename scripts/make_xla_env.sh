#!/usr/bin/env bash
# Make (or reuse) the torch-xla environment used by tests/compat/test_xla.py and for local
# XLA:CPU runs. torch-xla pins torch exactly, so it lives in its own venv:
#   ${DISTKIT_XLA_VENV:-$HOME/.cache/distkit/xla-venv}
# Reused when it already holds torch_xla (CI caches it between runs). About 7 GB and
# a few minutes to build the first time (PyPI's torch 2.9.0 is the CUDA build).
#
#   scripts/make_xla_env.sh            # build or reuse; prints the venv's python
#   PJRT_DEVICE=CPU "$(scripts/make_xla_env.sh)" -m distkit train --backend xla-tpu ...
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${DISTKIT_XLA_VENV:-$HOME/.cache/distkit/xla-venv}"
PY="$VENV/bin/python"
# Found without importing anything (importing torch_xla takes seconds).
FIND='import importlib.util as u, sys
for name in ("torch_xla", "ignite", "sklearn"):
    if u.find_spec(name) is None: sys.exit(1)
d = u.find_spec("distkit"); print(d.origin if d else "")'
# PYTHONPATH unset: a caller's (a checkout tested in place) would hide where the environment's
# own install points, and the environment runs without it.
if [ -x "$PY" ] && THERE="$(env -u PYTHONPATH "$PY" -c "$FIND" 2>/dev/null)"; then
    # Reuse; make sure distkit is this checkout's (editable, no deps).
    if [ "$THERE" != "$(pwd)/src/distkit/__init__.py" ]; then
        "$PY" -m pip install -q --no-deps -e . >&2
    fi
    echo "$PY"
    exit 0
fi
python3 -m venv "$VENV" >&2
"$PY" -m pip install -q --upgrade pip >&2
"$PY" -m pip install -q -r requirements-xla.txt >&2
# --no-deps: distkit's requirements.txt ranges must not move torch off 2.9.0.
"$PY" -m pip install -q --no-deps -e . >&2
"$PY" -c "import torch, torch_xla, ignite; print('xla env:', torch.__version__, torch_xla.__version__, ignite.__version__)" >&2
echo "$PY"
