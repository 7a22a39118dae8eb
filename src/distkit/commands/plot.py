"""``distkit plot RUN_DIR``: redraw ``RUN_DIR/learning_curves.png`` from its results.json.

A run writes results.json before its plot; when the plot could not be written (a full
disk, a broken matplotlib), the run says so and this command draws it again::

    distkit plot runs/20261126-123000-gloo-2procs
"""
from __future__ import annotations

import argparse
import os

from distkit.errors import DistkitError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run folder holding results.json")


def main(args) -> int:
    results = os.path.join(args.run_dir, "results.json")
    if not os.path.isfile(results):
        raise DistkitError(f"{results!r} does not exist: pass a run folder (<--output-dir>/<run>) "
                           "of a run that finished")
    from distkit.observe.reporting import draw_learning_curves

    try:
        path = draw_learning_curves(args.run_dir)
    except OSError as e:
        from distkit.checkpoint.saver import disk_error

        raise disk_error(e, args.run_dir) from None
    except ValueError as e:  # results.json that is not JSON
        raise DistkitError(f"{results!r} is not a results file ({e}): pass the folder of a run "
                           "distkit train wrote") from None
    print(path)
    return 0
