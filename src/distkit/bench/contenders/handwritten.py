"""The hand-written DDP loop, launched by torchrun: ``torchrun --nproc-per-node 2
handwritten.py --out rank0.json``. Plain torch.distributed, nothing else."""
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    args = common.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    common.pin_threads(int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    train_set, val_set = common.datasets()
    sampler = DistributedSampler(train_set, shuffle=True)
    loader = DataLoader(train_set, batch_size=args.batch_size // world, sampler=sampler)
    val_loader = DataLoader(val_set, batch_size=args.batch_size // world,
                            sampler=DistributedSampler(val_set, shuffle=False))
    model = DDP(common.model())
    opt = common.optimizer(model.parameters(), args.lr)
    sched = common.linear_decay(opt, args.epochs * len(loader))
    loss_fn = torch.nn.CrossEntropyLoss()
    record = common.Record()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        start = time.perf_counter()
        for x, y in loader:
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            loss.item()
            record.step_done()
            record.samples_per_epoch += len(x) * world if epoch == 0 else 0
        record.epoch_times_s.append(time.perf_counter() - start)
        model.eval()
        correct = torch.zeros(2)
        with torch.no_grad():
            for x, y in val_loader:
                correct += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)])
        dist.all_reduce(correct)
        record.final_val_accuracy = (correct[0] / correct[1]).item()
    record.write(args.out, rank, world_size=world)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    common.leave()
