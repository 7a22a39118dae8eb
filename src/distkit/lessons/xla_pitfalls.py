"""The three XLA pitfalls of notebook 03, each as a function that produces its evidence.

Run them in every rank (``distkit.launch.runner.run_per_rank(fn, n, backend)``);
:func:`initial_weights` runs on any backend, the other two need an XLA device.

1. :func:`initial_weights`: replicas must start from identical weights. On gloo/nccl,
   ``auto_model`` wraps the model in DistributedDataParallel, which broadcasts rank 0's
   weights; on XLA it only moves the model to the device, so ranks seeded differently
   (``manual_seed(seed + rank)``, common for data augmentation) train different models.
2. :func:`gradient_reductions_per_step`: ``create_supervised_trainer`` on an XLA device
   calls ``xm.optimizer_step`` (which all-reduces the gradients and steps), and the
   optimizer ``auto_optim`` returns on XLA does the same inside its ``step``: the
   gradients are reduced twice per step. The values stay right (the mean of N equal
   means is that mean) but every step pays the all-reduce twice.
3. :func:`data_time_split`: ``MpDeviceLoader`` (which ``auto_dataloader`` uses on XLA
   with more than one replica) cuts the lazy graph (``torch_xla.sync()``) when it hands
   out the next batch, so the previous step's graph is compiled and dispatched inside
   "data" time: a profiler then blames the data pipeline for compute.
"""
from __future__ import annotations

import os
import statistics
import time

import ignite
import ignite.distributed as idist
import torch
import torch.nn as nn
from ignite.engine import Engine, Events, create_supervised_trainer
from ignite.utils import manual_seed

from distkit.config import Config
from distkit.builtin.data import synthetic_dataset
from distkit.builtin.models import get_model


def _checksum(model: nn.Module) -> float:
    return float(sum(p.detach().double().sum().cpu().item() for p in model.parameters()))


def initial_weights(local_rank: int, seed: int = 0, seed_per_rank: bool = True) -> dict:
    """Build the model after ``manual_seed(seed + rank)`` (or ``seed`` on every rank) and
    report a checksum of its weights before and after ``idist.auto_model``."""
    rank = idist.get_rank()
    manual_seed(seed + rank if seed_per_rank else seed)
    model = get_model("cnn", in_channels=1, image_size=8, num_classes=10)
    before = _checksum(model)
    model = idist.auto_model(model)
    return {"rank": rank, "before_auto_model": before, "after_auto_model": _checksum(model),
            "auto_model_returned": type(model).__name__}


def _tiny_setup(seed: int = 0):
    manual_seed(seed)
    model = idist.auto_model(get_model("mlp", in_channels=1, image_size=8, num_classes=10))
    optimizer = idist.auto_optim(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    loader = torch.utils.data.DataLoader(synthetic_dataset(256), batch_size=16)
    return model, optimizer, nn.CrossEntropyLoss(), loader


def gradient_reductions_per_step(local_rank: int, iterations: int = 3) -> dict:
    """Count the calls to ``xm.reduce_gradients`` (the gradient all-reduce) per training
    step, for ignite's ``create_supervised_trainer`` and for distkit's ``create_trainer``,
    both with the optimizer from ``idist.auto_optim``. XLA device needed.

    The count wraps the real function (it still runs); it is restored afterwards."""
    import torch_xla.core.xla_model as xm

    from distkit.train.training import create_trainer

    calls = [0]
    original = xm.reduce_gradients

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    result = {"rank": idist.get_rank(), "optimizer": None}
    xm.reduce_gradients = counted  # xm.optimizer_step looks it up here at every call
    try:
        for name in ("create_supervised_trainer", "distkit.train.training.create_trainer"):
            model, optimizer, criterion, loader = _tiny_setup()
            result["optimizer"] = f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"
            if name == "create_supervised_trainer":
                trainer = create_supervised_trainer(model, optimizer, criterion, device=idist.device())
            else:
                trainer = create_trainer(model, optimizer, criterion, Config(amp=False))
            calls[0] = 0
            trainer.run(loader, max_epochs=1, epoch_length=iterations)
            result[name] = calls[0] / iterations
    finally:
        xm.reduce_gradients = original
    return result


def data_time_split(local_rank: int, use_mp_device_loader: bool, iterations: int = 12,
                    batch_size: int = 256) -> dict:
    """Median time per iteration spent fetching the batch ("data", what ignite's
    profilers report as dataflow) and in the step ("compute"), for the step torch-xla's
    own recipe teaches: ``xm.optimizer_step(optimizer)``, which all-reduces and steps but
    leaves the graph lazy. With ``MpDeviceLoader`` the loader cuts the graph when it hands
    out the next batch; with a plain DataLoader the step cuts it itself
    (``barrier=True``). XLA device needed."""
    import torch_xla
    import torch_xla.core.xla_model as xm
    from torch_xla.distributed.parallel_loader import MpDeviceLoader

    manual_seed(0)
    device = idist.device()
    model = get_model("cnn", in_channels=1, image_size=8, num_classes=10).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    loader = torch.utils.data.DataLoader(synthetic_dataset(16 * batch_size), batch_size=batch_size)
    if use_mp_device_loader:
        loader = MpDeviceLoader(loader, device)

    def step(engine, batch):
        x, y = batch[0].to(device), batch[1].to(device)  # already there with MpDeviceLoader
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        xm.optimizer_step(optimizer, barrier=not use_mp_device_loader)

    engine = Engine(step)
    marks, data, compute = {}, [], []
    engine.add_event_handler(Events.GET_BATCH_STARTED, lambda _: marks.__setitem__("d", time.perf_counter()))
    engine.add_event_handler(Events.GET_BATCH_COMPLETED,
                             lambda _: data.append(time.perf_counter() - marks["d"]))
    engine.add_event_handler(Events.ITERATION_STARTED, lambda _: marks.__setitem__("c", time.perf_counter()))
    engine.add_event_handler(Events.ITERATION_COMPLETED,
                             lambda _: compute.append(time.perf_counter() - marks["c"]))
    engine.run(loader, max_epochs=1, epoch_length=iterations)
    torch_xla.sync()
    d, c = statistics.median(data[2:]), statistics.median(compute[2:])  # after compilation
    return {"rank": idist.get_rank(), "mp_device_loader": use_mp_device_loader,
            "data_ms": 1e3 * d, "compute_ms": 1e3 * c, "data_share": d / (d + c)}


def ignite_source_evidence() -> dict:
    """The lines of the installed ignite that cause each pitfall, as ``file:line: code``
    (readable on any runtime, TPU or not)."""
    import inspect

    import ignite.distributed.auto as auto
    import ignite.engine as engine

    wanted = {
        "auto_model wraps in DDP (which broadcasts weights) only for these backends":
            (auto, "bnd in (idist_native.NCCL"),
        "create_supervised_trainer's step on XLA": (engine, "xm.optimizer_step(optimizer"),
        "the optimizer auto_optim returns on XLA": (auto, "xm.optimizer_step(self.wrapped_optimizer"),
        "auto_dataloader on XLA with several replicas": (auto, "mp_device_loader_cls(dataloader"),
    }
    found = {}
    for what, (module, needle) in wanted.items():
        lines, _ = inspect.findsource(module)
        path = inspect.getsourcefile(module)
        hits = [f"{os.path.relpath(path, os.path.dirname(os.path.dirname(ignite.__file__)))}:{i + 1}: "
                f"{line.strip()}" for i, line in enumerate(lines) if needle in line]
        found[what] = hits
    return found
