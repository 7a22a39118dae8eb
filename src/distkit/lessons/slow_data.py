"""A deliberately slow data pipeline, to make training data-bound on purpose, see it in the
profile, and fix it.

:class:`SlowDataset` makes every sample take ``delay_s`` longer to load, as if it were
read from slow storage (a network file system, an object store, a JPEG decode). With
``num_workers=0`` the training process loads each batch itself, and the model waits.
The fix is the ``DataLoader``'s: worker processes that load batches in parallel
(``num_workers``), each keeping ``prefetch_factor`` batches ready ahead of time,
``persistent_workers`` so they survive from one epoch to the next, and on CUDA
``pin_memory`` so that the copy to the GPU can overlap compute.

    from distkit.sharding import run_on_ranks
    from distkit.lessons.slow_data import profile_pipeline
    slow = run_on_ranks(profile_pipeline, 2, delay_s=0.002)
    fast = run_on_ranks(profile_pipeline, 2, delay_s=0.002, num_workers=8, prefetch_factor=4,
                        persistent_workers=True)
"""
from __future__ import annotations

import time

import ignite.distributed as idist
from ignite.engine import Events
from torch.utils.data import Dataset, Subset

from distkit.observe import profiling
from distkit.config import Config
from distkit.builtin.data import digits_dataset, split
from distkit.sharding import describe_loader


class SlowDataset(Dataset):
    """Wraps a map-style dataset; each item takes ``delay_s`` seconds longer to load."""

    def __init__(self, dataset, delay_s: float = 0.002):
        self.dataset, self.delay_s = dataset, delay_s

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        time.sleep(self.delay_s)  # waiting on storage: the CPU is idle, a worker can overlap it
        return self.dataset[i]


def loader_kwargs(num_workers: int = 0, pin_memory: bool | None = None,
                  prefetch_factor: int | None = None, persistent_workers: bool = False) -> dict:
    """DataLoader arguments for ``idist.auto_dataloader``. ``num_workers`` is GLOBAL (divided
    among the processes); ``pin_memory=None`` means "on with CUDA, off otherwise";
    ``prefetch_factor`` and ``persistent_workers`` only exist with workers."""
    kwargs = {"num_workers": num_workers,
              "pin_memory": idist.device().type == "cuda" if pin_memory is None else pin_memory}
    if num_workers > 0:
        if prefetch_factor is not None:
            kwargs["prefetch_factor"] = prefetch_factor
        kwargs["persistent_workers"] = persistent_workers
    return kwargs


def profile_pipeline(local_rank, delay_s: float = 0.002, batch_size: int = 64, epochs: int = 2,
                     samples: int | None = 768, progress_bar: bool = False, **loader_options) -> dict:
    """Run on EVERY rank: train the kit's CNN on the (slowed-down) digits for ``epochs``
    epochs with the profiler attached. Returns ``{"profile": <cross-rank summary>,
    "epoch_times": [...], "train_time_s": ..., "loader": <describe_loader>}``.

    ``samples``: train on the first ``samples`` training digits only (keeps it short);
    ``loader_options``: see :func:`loader_kwargs`."""
    from ignite.handlers import ProgressBar

    from distkit.train.training import create_trainer, initialize

    config = Config(dataset="digits", epochs=epochs, batch_size=batch_size, progress_bar=progress_bar)
    train_set, _ = split(digits_dataset(), seed=config.seed)
    if samples is not None:
        train_set = Subset(train_set, range(min(samples, len(train_set))))
    kwargs = loader_kwargs(**loader_options)
    loader = idist.auto_dataloader(SlowDataset(train_set, delay_s), batch_size=batch_size,
                                   shuffle=True, drop_last=True, **kwargs)
    model, optimizer, criterion = initialize(config)
    trainer = create_trainer(model, optimizer, criterion, config)

    @trainer.on(Events.EPOCH_STARTED)
    def reshuffle(engine):
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(engine.state.epoch - 1)

    epoch_times = []
    trainer.add_event_handler(Events.EPOCH_COMPLETED,
                              lambda e: epoch_times.append(e.state.times["EPOCH_COMPLETED"]))
    if progress_bar and idist.get_rank() == 0:
        ProgressBar(persist=False).attach(trainer, metric_names=["train_loss"])
    profile = profiling.attach(trainer)
    trainer.run(loader, max_epochs=epochs)
    return {"profile": profiling.summarize(profile), "epoch_times": epoch_times,
            "train_time_s": sum(epoch_times),
            "loader": describe_loader(loader, batch_size, loader_options.get("num_workers", 0)),
            "samples_per_epoch": len(loader) * batch_size}
