"""5. GPU: CIFAR-shaped ResNet-18 with bf16 autocast and channels_last, kit vs
hand-written loop (only with a CUDA device)."""
from __future__ import annotations

import time

import ignite.distributed as idist
import torch

from distkit.bench.method import TARGETS, Settings, compare, interleaved, summarize
from distkit.bench.sides import KitRun, handwritten_epochs, handwritten_setup, linear_decay
from distkit.config import Config
from distkit.train.training import initialize

def measure_gpu(settings: Settings, force: bool = False) -> dict:
    """Images/s of the CIFAR-shaped ResNet-18 with bf16 autocast and channels_last, kit
    vs hand-written, on the same batches already on the device. Needs CUDA; ``force``
    runs the same code on the CPU (for the tests)."""
    if not torch.cuda.is_available() and not force:
        return {"skipped": "no CUDA device"}
    device = idist.device()
    runs = settings.warmup + settings.repeats
    config = Config(dataset="cifar10", model="resnet18", batch_size=settings.gpu_batch, amp=True,
                    epochs=runs, progress_bar=False)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(config.batch_size, 3, 32, 32, generator=g)
                .to(device).contiguous(memory_format=torch.channels_last),
                torch.randint(0, 10, (config.batch_size,), generator=g).to(device))
               for _ in range(settings.gpu_steps)]

    model, optimizer, criterion = initialize(config)  # the kit: model on idist.device()
    model = model.to(memory_format=torch.channels_last)
    kit = KitRun(model, optimizer, criterion, batches, config)
    hand_model, hand_opt, hand_loss = handwritten_setup(config, device)
    hand_model = hand_model.to(memory_format=torch.channels_last)
    hand_sched = linear_decay(hand_opt, runs * len(batches))

    def synced(fn):
        def side():
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            samples = fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            return samples, time.perf_counter() - start
        return side

    sides = {"kit": synced(kit),
             "hand-written": synced(lambda: handwritten_epochs(
                 hand_model, hand_opt, hand_loss, batches, scheduler=hand_sched,
                 amp_dtype=torch.bfloat16))}
    rates = interleaved(sides, settings.repeats, settings.warmup)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (forced)"
    return {"device": name, "model": "resnet18 (CIFAR stem)", "batch_size": config.batch_size,
            "amp": "bfloat16", "memory_format": "channels_last", "steps_per_run": len(batches),
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "sides": {k: summarize(r) for k, r in rates.items()},
            **compare(rates["kit"], rates["hand-written"], TARGETS["gpu"])}

