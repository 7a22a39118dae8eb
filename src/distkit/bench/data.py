"""4. Data pipeline: loader throughput per ``num_workers`` (and ``pin_memory`` with
CUDA) against each model's compute throughput: when is training data-bound?"""
from __future__ import annotations

import statistics
import time

import ignite.distributed as idist
import torch
import torch.nn as nn
from ignite.utils import manual_seed
from torch.utils.data import DataLoader, Dataset

from distkit.bench.method import Settings, interleaved, summarize, timed, torch_threads
from distkit.bench.sides import KitRun
from distkit.config import Config
from distkit.builtin.data import TensorImageDataset, synthetic_dataset
from distkit.host.facts import threads_per_process
from distkit.builtin.models import get_model

class Augmented(Dataset):
    """The CIFAR-10 training augmentation (random 32x32 crop of a 4-pixel padded image,
    random horizontal flip), applied per sample as torchvision datasets do."""

    def __init__(self, dataset):
        from torchvision.transforms import v2

        self.dataset = dataset
        self.transform = v2.Compose([v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip()])

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        x, y = self.dataset[i]
        return self.transform(x), y


def _pipelines(settings, size):
    return {
        "in-memory 1x8x8": (synthetic_dataset(size), {"in_channels": 1, "image_size": 8}),
        "3x32x32 + crop/flip": (Augmented(synthetic_dataset(size, shape=(3, 32, 32))),
                                {"in_channels": 3, "image_size": 32}),
    }


def _loader_side(dataset, batch, workers, pin, batches):
    """Times ``batches`` batches after the first; the first (workers started, first batch
    made) is recorded apart in ``side.startup_s``: without ``persistent_workers`` a
    loader pays it again at every epoch. With CUDA each batch is also copied to the GPU
    (asynchronously from pinned memory), which is where ``pin_memory`` pays off."""
    cuda = torch.cuda.is_available()

    def side():
        start = time.perf_counter()
        loader = DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers,
                            pin_memory=pin)
        it = iter(loader)
        next(it)
        side.startup_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(batches):
            x, y = next(it)
            if cuda:
                x, y = x.to("cuda", non_blocking=pin), y.to("cuda", non_blocking=pin)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        del it
        return batches * batch, seconds
    side.startup_s = []
    return side


def measure_data(settings: Settings, threads: int | None = None) -> dict:
    """Loader samples/s for each ``num_workers`` (and ``pin_memory`` with CUDA) against
    each model's compute samples/s (the kit's trainer on batches already in memory):
    training is data-bound when the loader is the slower of the two."""
    cores = threads_per_process(1)
    threads = threads or cores
    # more workers than cores only makes them take turns (and torch warns)
    workers = [w for w in settings.data_workers if w <= max(2, cores)]
    b = settings.data_batch
    size = (settings.data_batches + 1) * b
    pins = (False, True) if torch.cuda.is_available() else (False,)
    runs = settings.warmup + settings.study_repeats
    out = {"batch_size": b, "threads": threads, "cores": cores, "num_workers": workers, "pipelines": {},
           "pin_memory": ("measured" if torch.cuda.is_available()
                          else "not measured: pinning only helps copies to a CUDA device")}
    with torch_threads(threads):
        for pname, (dataset, shape) in _pipelines(settings, size).items():
            loader_sides = {f"workers={w} pin={p}": _loader_side(dataset, b, w, p, settings.data_batches)
                            for w in workers for p in pins}
            compute_sides, kits = {}, {}
            for model in ("cnn", "mlp"):
                config = Config(model=model, batch_size=b, epochs=runs, progress_bar=False)
                manual_seed(0)
                net = get_model(model, num_classes=10, **shape).to(idist.device())
                opt = torch.optim.SGD(net.parameters(), lr=config.lr, momentum=config.momentum)
                batches = [dataset[i * b:(i + 1) * b] if isinstance(dataset, TensorImageDataset)
                           else _collate(dataset, i * b, b) for i in range(settings.compute_steps)]
                kits[model] = KitRun(net, opt, nn.CrossEntropyLoss(), batches, config)
                compute_sides[f"compute {model}"] = timed(kits[model])
            rates = interleaved({**loader_sides, **compute_sides}, settings.study_repeats,
                                settings.warmup)
            loaders = {k: {**summarize(rates[k]),
                           "startup_s_median": statistics.median(loader_sides[k].startup_s)}
                       for k in loader_sides}
            compute = {m: summarize(rates[f"compute {m}"]) for m in kits}
            verdicts = {}
            for m, c in compute.items():
                bound = [w for w in workers
                         if loaders[f"workers={w} pin=False"]["median"] >= c["median"]]
                verdicts[m] = {
                    "compute_samples_per_s": c["median"],
                    "compute_ms_per_batch": 1000 * b / c["median"],
                    "data_bound_with_0_workers": loaders["workers=0 pin=False"]["median"] < c["median"],
                    "fewest_workers_to_keep_up": bound[0] if bound else None,
                }
            out["pipelines"][pname] = {"loader": loaders, "compute": compute, "verdict": verdicts}
    return out


def _collate(dataset, start, n):
    xs, ys = zip(*(dataset[i] for i in range(start, start + n)))
    return torch.stack(xs), torch.stack(ys)

