"""Exercise 02: one training function for every launcher, with idist.auto_*. (Solution.)

See ``exercises/02_training_function.py`` for the task.
"""
import ignite.distributed as idist
import torch
import torch.nn as nn
from ignite.engine import Events, create_supervised_trainer


def make_model() -> nn.Module:
    """Given: a small classifier for 1x4x4 images and 4 classes. Do not change it."""
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def training(local_rank: int, config: dict):
    """Train ``make_model()`` on ``config["dataset"]`` in this process, as one of
    ``idist.get_world_size()`` processes; return ``(model, train_loader)``."""
    # The GLOBAL batch size goes in: auto_dataloader divides it by the world size and adds
    # a DistributedSampler, so each process reads its own part of the data.
    train_loader = idist.auto_dataloader(
        config["dataset"], batch_size=config["batch_size"], shuffle=True)
    # With several processes: DistributedDataParallel, which averages the gradients during
    # backward(), so every replica takes the same step. With one process: unchanged.
    model = idist.auto_model(make_model())
    # Build the optimizer on the parameters of the model auto_model returned.
    optimizer = idist.auto_optim(torch.optim.SGD(model.parameters(), lr=config["lr"]))
    trainer = create_supervised_trainer(
        model, optimizer, nn.CrossEntropyLoss(), device=idist.device())

    # The DistributedSampler shuffles with seed + epoch, and ignite's Engine never tells it
    # the epoch: without this every epoch repeats epoch 0's order. ignite counts epochs
    # from 1; the sampler from 0. With one process the loader has no DistributedSampler.
    @trainer.on(Events.EPOCH_STARTED)
    def reshuffle(engine):
        if hasattr(train_loader.sampler, "set_epoch"):
            train_loader.sampler.set_epoch(engine.state.epoch - 1)

    trainer.run(train_loader, max_epochs=config["epochs"])
    return model, train_loader
