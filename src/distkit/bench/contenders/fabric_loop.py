"""Lightning Fabric: ``python fabric_loop.py --out rank0.json`` (``fabric.launch()``
starts the second process by re-running this script)."""
import os
import sys
import time

import torch
from lightning.fabric import Fabric
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    args = common.parse_args()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp", num_nodes=1)
    fabric.launch()
    world = fabric.world_size
    common.pin_threads(world)
    train_set, val_set = common.datasets()
    loader = DataLoader(train_set, batch_size=args.batch_size // world, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=args.batch_size // world)
    model = common.model()
    opt = common.optimizer(model.parameters(), args.lr)
    model, opt = fabric.setup(model, opt)
    loader, val_loader = fabric.setup_dataloaders(loader, val_loader)  # DistributedSampler
    sched = common.linear_decay(opt, args.epochs * len(loader))
    loss_fn = torch.nn.CrossEntropyLoss()
    record = common.Record()
    for epoch in range(args.epochs):
        loader.sampler.set_epoch(epoch)
        model.train()
        start, samples = time.perf_counter(), 0
        for x, y in loader:
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            fabric.backward(loss)
            opt.step()
            sched.step()
            loss.item()
            record.step_done()
            samples += len(x)
        record.epoch_times_s.append(time.perf_counter() - start)
        record.samples_per_epoch = samples * world
        model.eval()
        correct = torch.zeros(2)
        with torch.no_grad():
            for x, y in val_loader:
                correct += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)])
        correct = fabric.all_reduce(correct, reduce_op="sum")
        record.final_val_accuracy = (correct[0] / correct[1]).item()
    record.write(args.out, fabric.global_rank, world_size=world)


if __name__ == "__main__":
    main()
