"""``distkit launch --trace``: torch.profiler traces of a script the kit has never seen.

A script under ``distkit launch`` has its own loop, so nothing of the kit's runs between
its steps. What every training script does call is ``optimizer.step()``: torch lets a
hook run after *every* optimizer's step (``torch.optim.optimizer.
register_optimizer_step_post_hook``), and that hook advances the profiler's schedule
(:data:`distkit.observe.tracing.WAIT`, ``WARMUP``, ``ACTIVE``: 2 steps skipped, 1 warm-up, 3
recorded). In each rank (:mod:`distkit.launch.script_worker`), while the profiler runs:

- a *step* is one ``optimizer.step()`` (of any optimizer: a script with two optimizers
  records half as many iterations). The step's boundary falls at the start of the next
  outermost module call, not inside the optimizer's own ``record_function`` range, in
  which torch calls the hook (ranges stay nested, as Perfetto wants them);
- the phases, as ``record_function`` ranges of the kit's names: ``forward`` (the
  outermost ``nn.Module`` call, through torch's global module hooks), ``backward``
  (``torch.autograd.backward``, which ``loss.backward()`` calls) and ``optimizer step``
  (torch's global optimizer step hooks); the script's own ``record_function`` ranges
  are in the trace as well;
- at the first recorded step, :func:`distkit.observe.tracing.clock_sync` plays ping-pong over
  the script's default process group (made by the script's ``init_process_group``) so
  the launcher can align the ranks' clocks. It assumes every rank steps its optimizer
  as often as the others (DDP's lockstep); a rank that does not is bounded by the
  group's timeout (``--timeout``);
- once the recorded steps are done (or the script ends earlier) the rank writes
  ``rank<N>.json`` (torch's ``export_chrome_trace``) and ``rank<N>.steps`` (how many
  optimizer steps it saw) into the launch's trace folder, then removes every hook: the
  rest of the script runs untraced. The file is written before the script ends, and at
  the latest before the worker's ``leave()``, which skips Python's finalization.

The launcher (:func:`collect`) then merges the ranks' files with
:func:`distkit.observe.tracing.write`, the same merge, clock alignment and drawing as
``distkit train --trace``.
"""
from __future__ import annotations

import os
import threading

from distkit.host.files import whole, write_text
from distkit.observe import tracing

TRACE_FOLDER = "DISTKIT_TRACE"
"""The environment variable that turns tracing on in a rank: the folder to write into."""
SCRIPT_PHASES = ("forward", "backward", "optimizer step")
"""The phases a script's trace has (no data wait, no validation: its loop is its own)."""


class ScriptTracer:
    """torch.profiler in one rank of a launched script, stepped by optimizer steps."""

    def __init__(self, folder: str, rank: int):
        self.folder, self.rank = folder, rank
        self.wait, self.warmup, self.active = tracing.WAIT, tracing.WARMUP, tracing.ACTIVE
        self.profiler = None
        self.steps = 0          # optimizer steps seen
        self.stepped = 0        # profiler steps taken (one behind while a step is pending)
        self.written = False
        self.handles = []
        self.depth = threading.local()
        self.ranges = threading.local()
        self._backward = None  # torch's own, while ours is in its place
        self._original_backward = None
        self.pid = os.getpid()  # a DataLoader worker forked from the rank inherits the hooks

    # --- start and stop ---------------------------------------------------------------
    def start(self) -> "ScriptTracer":
        import torch
        import torch.nn.modules.module as module_hooks
        import torch.optim.optimizer as optimizer_hooks
        self.profiler = tracing.new_profiler(self.wait, self.warmup, self.active, self._write)
        self.profiler.start()
        self.handles = [
            optimizer_hooks.register_optimizer_step_pre_hook(self._optimizer_started),
            optimizer_hooks.register_optimizer_step_post_hook(self._optimizer_done),
            module_hooks.register_module_forward_pre_hook(self._forward_started),
            module_hooks.register_module_forward_hook(self._forward_done, always_call=True),
        ]
        self._backward = self._original_backward = torch.autograd.backward
        torch.autograd.backward = self._traced_backward  # what Tensor.backward calls
        return self

    def finish(self) -> None:
        """Stop the profiler (writing what was recorded, if anything), remove the hooks,
        and write how many optimizer steps this rank saw. Idempotent."""
        import torch

        if self._backward is not None:
            torch.autograd.backward, self._backward = self._backward, None
        for handle in self.handles:
            handle.remove()
        self.handles = []
        if self.profiler is not None:
            profiler, self.profiler = self.profiler, None
            self._close("forward")
            self._close("optimizer step")
            profiler.stop()  # mid-recording: torch hands what it has to _write
            write_text(os.path.join(self.folder, f"rank{self.rank}.steps"), str(self.steps))

    # --- the hooks ----------------------------------------------------------------------
    def _open(self, name: str) -> None:
        from torch.profiler import record_function

        opened = getattr(self.ranges, "open", None) or {}
        self.ranges.open = opened
        if name not in opened:
            opened[name] = record_function(name)
            opened[name].__enter__()

    def _close(self, name: str) -> None:
        opened = getattr(self.ranges, "open", None) or {}
        if name in opened:
            opened.pop(name).__exit__(None, None, None)

    def _forward_started(self, module, args):
        if os.getpid() != self.pid:
            return  # a forked worker (a transform that is an nn.Module): not the rank's step
        depth = getattr(self.depth, "n", 0)
        if depth == 0:
            self._advance()  # a pending step ends where the next one's forward starts
            if self.profiler is not None:
                self._open("forward")
        self.depth.n = depth + 1

    def _forward_done(self, module, args, output):
        if os.getpid() != self.pid:
            return
        self.depth.n = max(0, getattr(self.depth, "n", 1) - 1)
        if self.depth.n == 0:
            self._close("forward")

    def _traced_backward(self, *args, **kwargs):
        from torch.profiler import record_function

        if self.profiler is None:  # finished (a script that kept a reference to it)
            return self._original_backward(*args, **kwargs)
        with record_function("backward"):
            return self._original_backward(*args, **kwargs)

    def _optimizer_started(self, optimizer, args, kwargs):
        if os.getpid() == self.pid:
            self._open("optimizer step")

    def _optimizer_done(self, optimizer, args, kwargs):
        if os.getpid() != self.pid:
            return
        self._close("optimizer step")
        self.steps += 1

    def _advance(self) -> None:
        """Take the profiler's steps owed for the optimizer steps made since the last."""
        while self.profiler is not None and self.stepped < self.steps:
            self.stepped += 1
            self.profiler.step()
            if self.stepped == self.wait + self.warmup:
                tracing.clock_sync()  # the first recorded step, every rank at the same one
            if self.stepped == self.wait + self.warmup + self.active:
                self.finish()  # recorded: the rest of the script runs untraced

    def _write(self, profiler) -> None:
        path = os.path.join(self.folder, f"rank{self.rank}.json")
        with whole(path) as partial:
            profiler.export_chrome_trace(partial)
        self.written = True


def start_from_environment() -> ScriptTracer | None:
    """The rank's tracer when the launcher asked for one (``DISTKIT_TRACE`` set)."""
    folder = os.environ.get(TRACE_FOLDER)
    if not folder:
        return None
    from distkit.host.layout import world_layout

    return ScriptTracer(folder, world_layout().rank).start()


# --- in the launcher, after every rank has ended ------------------------------------------

def collect(run_dir: str, world_size: int, script: str) -> tuple[dict | None, str]:
    """Merge and draw the ranks' traces in ``<run_dir>/trace`` (:func:`distkit.observe.tracing.
    write`); return ``(paths or None, the one line to print)``. Nothing is written when
    no rank recorded a step."""
    folder = os.path.join(run_dir, "trace")
    steps, traces = [], []
    for rank in range(world_size):
        steps.append(_read_int(os.path.join(folder, f"rank{rank}.steps")))
        path = os.path.join(folder, f"rank{rank}.json")
        traces.append(tracing.load(path) if os.path.exists(path) else None)
    if not any(traces):
        most = max((s for s in steps if s is not None), default=0)
        skipped = tracing.WAIT + tracing.WARMUP
        why = ("made no optimizer step (the trace counts torch.optim steps: a script without "
               "an optimizer has none)" if most == 0 else
               f"made {most} optimizer step(s), not more than the {skipped} the trace skips "
               "before recording")
        return None, f"distkit: --trace recorded nothing: {script} {why}; no trace written"
    paths = tracing.write(traces, folder)
    merged = tracing.load(paths["merged"])
    recorded = len(tracing.steps(merged, 0))
    missing = [r for r, t in enumerate(traces) if t is None]
    paths["steps_recorded"] = recorded
    note = (f" (rank {', '.join(map(str, missing))} recorded no step: its row is empty)"
            if missing else "")
    return paths, (f"distkit: trace of {recorded} step(s) on {world_size} ranks{note}: "
                   f"{paths['merged']} (open it in https://ui.perfetto.dev), drawn in "
                   f"{paths['png']}; paths in {os.path.join(run_dir, 'results.json')}")


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def record(run_dir: str, script: str, args, world_size: int, paths: dict | None) -> None:
    """``<run_dir>/results.json`` of a launch: the script, its arguments, the world size,
    and ``"trace"`` as ``distkit train --trace`` names it (None: nothing recorded)."""
    from distkit.checkpoint.saver import write_results

    write_results(run_dir, {"script": script, "args": list(map(str, args)),
                            "world_size": world_size, "trace": paths})
