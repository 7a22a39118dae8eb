"""A loss or a weight that is not finite (NaN, inf) stops the run, on every rank, in one line.

Each rank looks at its own loss at every iteration (a float it has already: free) and at
its weights whenever the ranks agree. The ranks agree on what they saw where they already
meet: at the stop agreement every ``CHECK_EVERY`` iterations (:mod:`distkit.train.stopping`,
the same one collective), before every checkpoint is written and before every epoch's
validation. So every rank stops at the same iteration, within ``CHECK_EVERY`` iterations
of the first non-finite value, and no checkpoint or best model is written from then on:
the newest checkpoint is the last finite one, and the line names it.

Under DDP one rank's NaN gradient reaches every rank's weights at that step's all-reduce,
so the line names the rank(s) whose loss was not finite first, and the iteration.
"""
from __future__ import annotations

import math

import ignite.distributed as idist
import torch

from distkit.errors import DistkitError


class NonFinite(DistkitError):
    """Training met a NaN or inf; ``iteration``, ``ranks``, ``what`` ("loss" or
    "weights") and ``checkpoint`` (the last finite one, or None) say where."""

    def __init__(self, message: str, iteration: int = 0, ranks=(), what: str = "loss",
                 checkpoint: str | None = None):
        super().__init__(message)
        self.iteration, self.ranks, self.what = int(iteration), tuple(ranks), what
        self.checkpoint = checkpoint

    def __reduce__(self):  # crosses process boundaries whole
        return (type(self), (str(self), self.iteration, self.ranks, self.what, self.checkpoint))


LOSS, WEIGHTS = 1, 2


class FiniteWatch:
    """This rank's first non-finite iteration (0: none yet) and what it was in."""

    def __init__(self, model):
        self.model, self.iteration, self.what = model, 0, 0

    def see_loss(self, iteration: int, loss) -> None:
        if not self.iteration and not math.isfinite(loss):
            self.iteration, self.what = iteration, LOSS

    def see_weights(self, iteration: int) -> None:
        if not self.iteration and not weights_finite(self.model):
            self.iteration, self.what = iteration, WEIGHTS

    def mine(self) -> list[int]:
        """What this rank contributes to an agreement: ``[iteration, what]``."""
        return [self.iteration, self.what]


def weights_finite(model) -> bool:
    """Every parameter of this rank (its shard under fsdp) finite: one pass, one sync."""
    flags = [torch.isfinite(_local(p.detach())).all() for p in model.parameters()]
    return bool(torch.stack(flags).all()) if flags else True


def _local(tensor):
    """This rank's part of a parameter (a DTensor's local shard under fsdp: no collective)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def gather(values: list[int]) -> list[list[int]]:
    """Every rank's ``values`` (ints, the same count everywhere), in rank order."""
    if idist.get_world_size() == 1:
        return [list(values)]
    mine = torch.tensor(values, dtype=torch.int64)
    device = idist.device() if idist.backend() == "nccl" else torch.device("cpu")
    rows = idist.all_gather(mine.to(device)).cpu().reshape(idist.get_world_size(), -1)
    return [[int(v) for v in row] for row in rows]


def verdict(seen: list[list[int]]) -> tuple[int, list[int], str] | None:
    """From every rank's ``[iteration, what]``: ``(first iteration, the ranks that saw it
    there, "loss" or "weights")``, or None when every rank is finite."""
    bad = [(it, what, rank) for rank, (it, what) in enumerate(seen) if it]
    if not bad:
        return None
    first = min(it for it, _, _ in bad)
    at_first = [(what, rank) for it, what, rank in bad if it == first]
    # a rank whose loss was NaN is the cause; the others' weights took it at the all-reduce
    losses = [rank for what, rank in at_first if what == LOSS]
    if losses:
        return first, losses, "loss"
    return first, [rank for _, rank in at_first], "weights"


def stop_line(first: int, ranks: list[int], what: str, epoch_length: int,
              checkpoint: str | None) -> str:
    """The one line: where it happened, that every rank stopped, what is kept, the fix."""
    epoch = (first - 1) // max(epoch_length, 1) + 1
    where = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
    kept = (f"the last finite checkpoint is {checkpoint}" if checkpoint
            else "no checkpoint was written before it")
    return (f"the {what} became NaN or inf at iteration {first} (epoch {epoch}) on {where}: "
            f"training stopped on every rank and nothing after it was saved; {kept}; lower "
            "--lr or check that iteration's batch, then resume from that checkpoint (a task "
            "that trains on through non-finite values sets Task(stop_on_non_finite=False))")


class FiniteGuard:
    """The watch of this rank and the agreement of all: :meth:`check` (a collective) raises
    :class:`NonFinite` on every rank alike when some rank saw a NaN or inf.
    ``last_checkpoint()`` names the newest checkpoint written (all finite, by this guard)."""

    def __init__(self, model, last_checkpoint):
        self.watch, self.last_checkpoint = FiniteWatch(model), last_checkpoint

    def see_loss(self, engine) -> None:
        output = engine.state.output
        loss = output.get("loss") if isinstance(output, dict) else None
        if isinstance(loss, float):
            self.watch.see_loss(engine.state.iteration, loss)

    def mine(self, iteration: int) -> list[int]:
        """This rank's ``[iteration, what]``, its weights looked at now."""
        self.watch.see_weights(iteration)
        return self.watch.mine()

    def check(self, engine, seen: list[list[int]] | None = None) -> None:
        """Raise :class:`NonFinite` if any rank saw a non-finite value; ``seen``: every
        rank's :meth:`mine` when an agreement gathered them already, else gathered here."""
        if seen is None:  # this iteration's loss too: the checkpoint's handler comes first
            self.see_loss(engine)
            seen = gather(self.mine(engine.state.iteration))
        found = verdict(seen)
        if found is None:
            return
        first, ranks, what = found
        checkpoint = self.last_checkpoint()
        raise NonFinite(stop_line(first, ranks, what, engine.state.epoch_length, checkpoint),
                        first, ranks, what, checkpoint)
