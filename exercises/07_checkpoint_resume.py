"""Exercise 07: rank-safe checkpoints, and a resume that continues exactly.

Topic: checkpoints and fault tolerance. A run on many processes can die at any
iteration. A checkpoint must then hold everything that the next step depends on, so that
a resumed run ends with EXACTLY the weights of a run that never stopped:

- the model's weights,
- the optimizer's state (SGD with momentum keeps a running average of past gradients),
- the trainer's state (epoch and iteration: where to continue, which batches come next).

And it must be rank-safe: ignite's ``Checkpoint`` is created on EVERY rank (on TPUs
saving is a collective that all ranks join; its ``DiskSaver`` writes on rank 0 only, so
the ranks never write the same file at once), and on resume EVERY rank loads it (each
rank holds its own replica; loading on rank 0 alone leaves the others where they were).

Task: write two functions.

1. ``attach_checkpointing(trainer, model, optimizer, dirname)``: create an
   ``ignite.handlers.Checkpoint`` that saves trainer, model and optimizer into
   ``dirname`` (a ``DiskSaver``; the folder may already exist and hold checkpoints: a
   resumed run saves into the folder it resumed from) after EVERY iteration, keeping the
   last 2 files, each numbered by the iteration it holds (``checkpoint_7.pt`` holds
   iteration 7); attach it to ``trainer`` and return it.
2. ``resume(trainer, model, optimizer, checkpoint_file)``: read that file with the
   given ``read_checkpoint`` (``torch.load(..., weights_only=True)``: never unpickle
   arbitrary objects) and load it into the same three objects.

The check runs 1 process (no process group), 2 and 3 processes, and 2 nodes x 2
processes; with several, ``model`` is wrapped in DistributedDataParallel (``Checkpoint``
handles that: it saves the inner module's weights), with one it is the plain module.

Check it:  pytest exercises -m ex07     (or: distkit check 07)
Stuck?     distkit check 07 --hint     (or read exercises/hints.md)
"""
import ignite.distributed as idist
import torch
from ignite.engine import Events
from ignite.handlers import Checkpoint, DiskSaver


def read_checkpoint(path: str) -> dict:
    """Given: ``torch.load(path, weights_only=True)``, which loads tensors and plain
    containers only, so a file from elsewhere cannot run code. (The trainer here is
    distkit's ``Trainer``, ignite's ``DeterministicEngine`` whose saved state is plain
    tensors, so this safe load accepts it.) Do not change it."""
    return torch.load(path, map_location="cpu", weights_only=True)


def attach_checkpointing(trainer, model, optimizer, dirname: str) -> Checkpoint:
    """Save trainer, model and optimizer after every iteration (last 2 kept, each file
    numbered by the iteration it holds); return the Checkpoint. Called on every rank."""
    # TODO: a Checkpoint with a DiskSaver, attached to the trainer.
    raise NotImplementedError("exercise 07: write attach_checkpointing")


def resume(trainer, model, optimizer, checkpoint_file: str) -> None:
    """Load ``checkpoint_file`` into trainer, model and optimizer. Called on every rank."""
    # TODO: read the file with read_checkpoint, then put its contents back into the
    # three objects.
    raise NotImplementedError("exercise 07: write resume")
