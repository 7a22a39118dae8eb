"""HF accelerate: ``accelerate launch --multi_gpu --num_processes 2 accelerate_loop.py
--out rank0.json`` (on a CPU machine ``--multi_gpu`` is what starts 2 gloo processes;
``--cpu`` starts one)."""
import os
import sys
import time

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    args = common.parse_args()
    accelerator = Accelerator(cpu=True)
    world = accelerator.num_processes
    common.pin_threads(int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    train_set, val_set = common.datasets()
    # accelerate shards a loader whose batch is the per-process batch
    loader = DataLoader(train_set, batch_size=args.batch_size // world, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=args.batch_size // world)
    model = common.model()
    opt = common.optimizer(model.parameters(), args.lr)
    # accelerate steps a prepared scheduler once per process at every step, so the
    # schedule counts the unsharded loader's steps
    sched = common.linear_decay(opt, args.epochs * len(loader))
    model, opt, loader, val_loader, sched = accelerator.prepare(model, opt, loader, val_loader, sched)
    loss_fn = torch.nn.CrossEntropyLoss()
    record = common.Record()
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        model.train()
        start, samples = time.perf_counter(), 0
        for x, y in loader:
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            accelerator.backward(loss)
            opt.step()
            sched.step()
            loss.item()
            record.step_done()
            samples += len(x)
        record.epoch_times_s.append(time.perf_counter() - start)
        record.samples_per_epoch = samples * world
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for x, y in val_loader:
                pred, y = accelerator.gather_for_metrics((model(x).argmax(1), y))
                correct += (pred == y).sum().item()
                total += len(y)
        record.final_val_accuracy = correct / total
    record.write(args.out, accelerator.process_index, world_size=world)
    accelerator.end_training()


if __name__ == "__main__":
    main()
