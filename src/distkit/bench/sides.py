"""The two sides of every kit-vs-hand-written comparison: the kit's trainer
(:class:`KitRun`) and a minimal hand-written loop doing the same work per step."""
from __future__ import annotations

import os

import torch
import torch.nn as nn
from ignite.engine import Events

from distkit.config import Config
from distkit.builtin.models import get_model
from distkit.train.training import at_most_every, attach_step_handlers, create_lr_scheduler, create_trainer


class KitRun:
    """The kit's trainer with the handlers that ``distkit.train.training.training`` attaches
    to every step or epoch of training: ``create_trainer`` (a ``DeterministicEngine``
    whose step is forward, backward, optimizer step and ``loss.item()``, and the epoch's
    mean loss), the lr schedule of ``create_lr_scheduler`` at every
    ``ITERATION_STARTED``, the sampler's ``set_epoch`` at every ``EPOCH_STARTED``, and the
    sample counter. Validation and checkpoints, which ``training()`` runs between epochs,
    are not training throughput and are left out (the hand-written loop has none).

    ``handlers=False`` leaves out the lr schedule (``attach_step_handlers`` with no
    scheduler: the per-epoch reshuffle and the sample counter stay);
    ``progress_bar=True`` adds the ``ProgressBar`` that ``distkit train`` shows by
    default (written to /dev/null here). Calling it trains ``epochs`` epochs and returns
    the samples this process trained on."""

    def __init__(self, model, optimizer, criterion, loader, config, handlers=True, progress_bar=False):
        self.loader = loader
        self.trainer = create_trainer(model, optimizer, criterion, config)
        schedule = create_lr_scheduler(config, optimizer, len(loader)) if handlers else None
        attach_step_handlers(self.trainer, loader, schedule)
        if progress_bar:
            from ignite.handlers import ProgressBar

            self._devnull = open(os.devnull, "w")
            ProgressBar(persist=False, file=self._devnull).attach(  # as training() attaches it
                self.trainer, output_transform=lambda out: {"loss": out["loss"]},
                event_name=Events.ITERATION_COMPLETED(event_filter=at_most_every(0.1)))

    def __call__(self, epochs: int = 1) -> int:
        self.trainer.run(self.loader, max_epochs=epochs)
        return self.trainer.state.samples


def handwritten_epochs(model, optimizer, criterion, loader, epochs=1, scheduler=None,
                       sampler=None, amp_dtype=None) -> int:
    """The minimal loop the kit is measured against. It does the same work per step as
    the kit's ``train_step``: forward, loss, backward, optimizer step, the lr schedule,
    and ``loss.item()`` (the kit reads the loss every step for its running average; on a
    GPU that is a sync point, so the baseline must pay it too)."""
    device = next(model.parameters()).device
    samples = 0
    for epoch in range(epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if amp_dtype is None:
                loss = criterion(model(x), y)
            else:
                with torch.autocast(device.type, dtype=amp_dtype):
                    loss = criterion(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            loss.item()  # read the loss every step, as the kit does
            samples += len(x)
    return samples


def handwritten_setup(config, device, ddp=False):
    """Model, optimizer and loss written out by hand: the same model class, seed and
    hyper-parameters as ``distkit.train.training.initialize``; ``ddp=True`` wraps the model in
    ``DistributedDataParallel`` on the default process group."""
    from distkit.builtin.data import dataset_info

    torch.manual_seed(config.seed)
    model = get_model(config.model, **dataset_info(config.dataset)).to(device)
    if ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                                weight_decay=config.weight_decay)
    return model, optimizer, nn.CrossEntropyLoss()


def linear_decay(optimizer, total_steps):
    """The kit's default schedule (no warm-up, linear decay to 0), as torch's ``LinearLR``."""
    return torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.0,
                                             total_iters=total_steps)

def bench_config(settings, model="cnn", batch_size=None, runs=1, steps=None) -> Config:
    """A synthetic-data config whose training set is exactly ``steps`` global batches.
    ``epochs`` covers every run, so the lr schedule never runs out."""
    batch_size = batch_size or settings.batch_size
    steps = steps or settings.steps
    return Config(dataset="synthetic", model=model, batch_size=batch_size,
                  dataset_size=steps * batch_size, epochs=runs, progress_bar=False,
                  backend="gloo", num_workers=0)

