#!/usr/bin/env python3
"""Launch the unchanged ``distkit train`` on a Colab runtime (CPU, GPU or TPU).

Exact command, in a Colab cell after any notebook's install cell, which installs distkit
and defines ``REPO_URL`` (IPython expands ``$REPO_URL``; the URL itself lives only in
pyproject.toml's ``[project.urls]``). Extra flags go to ``distkit train``:

    !git clone -q $REPO_URL distkit-repo && python distkit-repo/scripts/colab_launch.py --epochs 3

(With a published repository only; until then upload a clone's ``scripts/colab_launch.py``
beside the wheel and run ``!python colab_launch.py --epochs 3``: docs/colab.md.)

In a clone that is already installed: ``python scripts/colab_launch.py --epochs 3``;
``--dry-run`` prints the command it would run and stops.

It looks at the runtime, prints the ``distkit train`` command it chose, and runs it as a
child process, so a crash in training cannot take the notebook's kernel down with it:

- TPU runtime (torch_xla importable, a TPU visible): ``--backend xla-tpu`` with
  ``PJRT_DEVICE=TPU``, one process (PJRT drives every local TPU core from it);
- GPU runtime: ``--backend nccl --nproc-per-node <number of GPUs>`` (1 on Colab);
- CPU runtime: ``--backend gloo --nproc-per-node 2`` (Colab gives 2 cores).

From inside a notebook, without a child process, the same run is
``distkit.launch.entry.run(Config(...))``: ``idist.Parallel`` forks the processes there.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_notebooks import REPO_URL, is_published  # noqa: E402  (pyproject.toml [project.urls])


def in_colab() -> bool:
    return "COLAB_RELEASE_TAG" in os.environ or "google.colab" in sys.modules


def choose(argv: list) -> tuple[list, dict]:
    """The ``distkit train`` command line and the environment for this runtime. Flags the
    user gave win over the chosen ones."""
    from distkit.launch.checks import default_nproc, resolve_backend

    backend = resolve_backend("auto")
    env = dict(os.environ)
    chosen = ["--backend", backend]
    if backend == "xla-tpu":
        env.setdefault("PJRT_DEVICE", "TPU")
    else:
        chosen += ["--nproc-per-node", str(default_nproc(backend))]
    given = {a.split("=")[0] for a in argv if a.startswith("--")}
    kept = []
    for i in range(0, len(chosen), 2):
        if chosen[i] not in given:
            kept += chosen[i:i + 2]
    return [sys.executable, "-m", "distkit", "train", *kept, *argv], env


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    dry_run = "--dry-run" in argv
    argv = [a for a in argv if a != "--dry-run"]
    if importlib.util.find_spec("distkit") is None:
        how = f"pip install git+{REPO_URL}" if is_published(REPO_URL) else "install a wheel (docs/colab.md)"
        print(f"distkit: error: distkit is not installed here: run a notebook's install cell, or {how}",
              file=sys.stderr)
        return 1
    cmd, env = choose(argv)
    where = "Colab" if in_colab() else "not Colab"
    shown = " ".join(["distkit", *cmd[3:]])
    print(f"# {where}; PJRT_DEVICE={env.get('PJRT_DEVICE', '-')}\n+ {shown}", flush=True)
    if dry_run:
        return 0
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())
