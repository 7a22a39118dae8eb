"""Plain ignite, as its examples write it: ``idist.Parallel`` spawns the processes,
``auto_dataloader`` / ``auto_model`` / ``auto_optim``, ``create_supervised_trainer`` and
an evaluator with ``Accuracy``. ``python ignite_plain.py --out rank0.json``"""
import os
import sys

import ignite.distributed as idist
import torch
from ignite.engine import Events, create_supervised_evaluator, create_supervised_trainer
from ignite.handlers import LRScheduler
from ignite.metrics import Accuracy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def training(local_rank, args):
    common.pin_threads(idist.get_nproc_per_node())
    train_set, val_set = common.datasets()
    loader = idist.auto_dataloader(train_set, batch_size=args.batch_size, shuffle=True)
    val_loader = idist.auto_dataloader(val_set, batch_size=args.batch_size, shuffle=False)
    model = idist.auto_model(common.model())
    opt = idist.auto_optim(common.optimizer(model.parameters(), args.lr))
    trainer = create_supervised_trainer(model, opt, torch.nn.CrossEntropyLoss())
    trainer.add_event_handler(Events.ITERATION_COMPLETED,
                              LRScheduler(common.linear_decay(opt, args.epochs * len(loader))))
    evaluator = create_supervised_evaluator(model, metrics={"accuracy": Accuracy()})
    record = common.Record()
    record.samples_per_epoch = len(loader.sampler) * idist.get_world_size()

    @trainer.on(Events.ITERATION_COMPLETED)
    def step_done(_):
        record.step_done()

    @trainer.on(Events.EPOCH_COMPLETED)
    def validate(engine):
        record.epoch_times_s.append(engine.state.times["EPOCH_COMPLETED"])
        record.final_val_accuracy = evaluator.run(val_loader).metrics["accuracy"]

    trainer.run(loader, max_epochs=args.epochs)
    record.write(args.out, idist.get_rank(), world_size=idist.get_world_size())


if __name__ == "__main__":
    args = common.parse_args()
    port = int(os.environ.get("MASTER_PORT", 2222))  # the benchmark passes a free one
    with idist.Parallel(backend="gloo", nproc_per_node=2, master_port=port) as parallel:
        parallel.run(training, args)
