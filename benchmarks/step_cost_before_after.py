"""The kit's fixed cost per training step, before and after issue 16, in one run.

Three sides on the kit's MLP at batch 8 (a step so small it is almost all overhead),
1 torch thread, interleaved round by round: the hand-written loop of ``distkit.bench``,
the kit's trainer as it was (``model.train()`` and a disabled ``torch.autocast`` context
on every step, ignite's ``Average`` updated every step), and the kit's trainer as it is.
Prints each side's CPU microseconds per step and its extra over the hand-written loop
(median over rounds of the round's difference).

    python benchmarks/step_cost_before_after.py [steps per run] [rounds]
"""
import logging
import os
import statistics
import sys
import time

import ignite.distributed as idist
import torch
from ignite.metrics import Average

import distkit.bench.sides as sides_module
from distkit.bench.method import MODES
from distkit.bench.sides import KitRun, bench_config, handwritten_epochs, handwritten_setup, linear_decay
from distkit.builtin.data import get_dataflow
from distkit.train.training import Trainer, initialize


def create_trainer_before(model, optimizer, criterion, config):
    """``distkit.train.training.create_trainer`` before issue 16 (its XLA branch left out)."""
    device = idist.device()

    def train_step(engine, batch):
        model.train()
        x = batch[0].to(device, non_blocking=True)
        y = batch[1].to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.amp):
            loss = criterion(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return {"loss": loss.item(), "batch_size": len(x)}

    trainer = Trainer(train_step)
    Average(output_transform=lambda out: out["loss"]).attach(trainer, "train_loss")
    return trainer


def main(steps=200, rounds=31, warmup=2):
    logging.disable(logging.INFO)
    torch.set_num_threads(1)
    runs = rounds + warmup
    config = bench_config(MODES["quick"], model="mlp", batch_size=8, runs=runs, steps=steps)
    loader, _ = get_dataflow(config)

    def kit():
        model, optimizer, criterion = initialize(config)
        return KitRun(model, optimizer, criterion, loader, config)

    after = kit()
    current, sides_module.create_trainer = sides_module.create_trainer, create_trainer_before
    try:
        before = kit()
    finally:
        sides_module.create_trainer = current
    hand_model, hand_opt, hand_loss = handwritten_setup(config, torch.device("cpu"))
    schedule = linear_decay(hand_opt, runs * len(loader))
    sides = {"hand-written": lambda: handwritten_epochs(hand_model, hand_opt, hand_loss, loader,
                                                        scheduler=schedule),
             "kit before": before, "kit after": after}
    names = list(sides)
    us = {name: [] for name in names}
    for r in range(runs):
        for name in names[r % 3:] + names[:r % 3]:
            cpu = time.process_time()
            samples = sides[name]()
            if r >= warmup:
                us[name].append(1e6 * (time.process_time() - cpu) / (samples / config.batch_size))
    print(f"kit's MLP, batch 8, 1 thread, {steps} steps a run, {rounds} rounds; load average "
          f"{os.getloadavg()[0]:.1f} at the end")
    for name in names:
        extra = statistics.median(a - b for a, b in zip(us[name], us["hand-written"]))
        print(f"{name:13} {statistics.median(us[name]):7.1f} us of CPU per step   extra over "
              f"hand-written {extra:+6.1f} us")


if __name__ == "__main__":
    main(*map(int, sys.argv[1:3]))
