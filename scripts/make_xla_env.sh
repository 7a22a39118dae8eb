#!/usr/bin/env bash
# Make (or reuse) the torch-xla environment used by tests/test_xla.py and for local
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
if [ -x "$PY" ] && "$PY" -c "import torch_xla, ignite, distkit" >/dev/null 2>&1; then
    # Reuse; make sure distkit points at this checkout (editable, no deps).
    "$PY" -m pip install -q --no-deps -e . >&2
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
