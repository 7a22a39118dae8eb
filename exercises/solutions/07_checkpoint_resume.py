"""Exercise 07: rank-safe checkpoints, and a resume that continues exactly. (Solution.)

See ``exercises/07_checkpoint_resume.py`` for the task.
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


def _objects(trainer, model, optimizer) -> dict:
    # One dict for saving and for loading, so the two can never disagree. The trainer
    # brings epoch and iteration; the optimizer its momentum buffers.
    return {"trainer": trainer, "model": model, "optimizer": optimizer}


def attach_checkpointing(trainer, model, optimizer, dirname: str) -> Checkpoint:
    """Save trainer, model and optimizer after every iteration (last 2 kept, each file
    numbered by the iteration it holds); return the Checkpoint. Called on every rank."""
    # Created on every rank: DiskSaver writes on rank 0 only (atomically: a temporary file,
    # then a rename, so a crash never leaves half a checkpoint), and on TPUs saving is a
    # collective that every rank must join. require_empty=False: resuming into the same
    # folder is fine.
    checkpoint = Checkpoint(
        _objects(trainer, model, optimizer),
        DiskSaver(dirname, require_empty=False, atomic=True),
        n_saved=2,
        global_step_transform=lambda engine, _: engine.state.iteration)
    trainer.add_event_handler(Events.ITERATION_COMPLETED, checkpoint)
    return checkpoint


def resume(trainer, model, optimizer, checkpoint_file: str) -> None:
    """Load ``checkpoint_file`` into trainer, model and optimizer. Called on every rank."""
    # Every rank loads: each process holds its own replica, and DDP only broadcasts the
    # weights when it wraps the model, not after. Checkpoint.load_objects puts each saved
    # state dict back (into the inner module of a DDP model, too).
    Checkpoint.load_objects(_objects(trainer, model, optimizer), read_checkpoint(checkpoint_file))
