"""``training(local_rank, config, task)``: the one function every launcher runs, unchanged.

``idist.Parallel`` spawn, torchrun on one or many nodes, SLURM: they all end up calling
this function once per process. The :class:`~distkit.tasks.Task` says what to train (data,
model, loss, metrics, score); this module says how to train it in parallel. Everything
that depends on *where* it runs is handled by ``idist``: ``auto_dataloader`` shards the
data, ``auto_model`` wraps the model in DistributedDataParallel (or does nothing on one
process), ``auto_optim`` adapts the optimizer (XLA). The few lines that care about the rank are marked ``rank == 0``.
"""
from __future__ import annotations

import gc
import os
import time

import ignite.distributed as idist
import torch
from ignite.engine import Events, create_supervised_evaluator
from ignite.engine.deterministic import DeterministicEngine, ReproducibleBatchSampler
from ignite.handlers import Checkpoint, EarlyStopping, ProgressBar
from ignite.utils import manual_seed
from torch.utils.data import DataLoader

from distkit.observe import profiling, throughput, tracing, tracking
from distkit.train import signals, stopping
from distkit.compat.shims import broadcast_text
from distkit.train.finite import FiniteGuard
from distkit.train.agreement import check_in_ranks, check_replicas_identical
from distkit.checkpoint.saver import (CHECKPOINT_PREFIX, RunSettings, checkpoint_iteration,
                                checkpoint_saver, load_checkpoint, make_run_dir, resume_settings,
                                to_save)
from distkit.checkpoint.reshard import adapt_checkpoint
from distkit.builtin.data import get_dataflow
from distkit.host.facts import ranks_on_this_host, threads_per_process
from distkit.host.layout import world_layout
from distkit.observe.failures import training_in
from distkit.observe.reporting import RunRecord, report, saved_path
from distkit.train.strategies import (checkpoint_objects, full_state_dict_everywhere,
                                 peak_memory_per_rank, prepare_model)
from distkit.errors import DistkitError
from distkit.train.schedules import (LrTrace, NoSchedule, create_lr_scheduler, peak_lr,  # noqa: F401
                               schedule_kind, scheduler_name, scheduler_step, task_lr_scheduler)
from distkit.tasks import Task, prepare_xy, resolve_task
from distkit.train.effective import effective_config


def initialize(config, task: Task | None = None):
    """Model, optimizer and loss of ``task`` (default: the built-in task of
    ``config.dataset`` x ``config.model``), adapted to this process by ``idist.auto_*``.

    Every rank seeds the same generator before building the model, so every replica
    starts from identical weights (DDP would broadcast them, XLA would not). In one plain
    process ``auto_model`` and ``auto_optim`` leave them as they are::

        >>> from distkit import Config
        >>> model, optimizer, criterion = initialize(Config(model="mlp"))
        >>> type(model).__name__, type(optimizer).__name__, type(criterion).__name__
        ('MLP', 'SGD', 'CrossEntropyLoss')
    """
    task = resolve_task(task if task is not None else config)
    manual_seed(config.seed)
    # ddp: idist.auto_model; fsdp: fully_shard per layer (distkit.train.strategies)
    model = prepare_model(task.model(config), config.strategy)
    optimizer = idist.auto_optim(task.optimizer(model.parameters(), config))
    criterion = task.loss().to(idist.device())
    return model, optimizer, criterion


def stopped_early(trainer, evaluator, config) -> dict | None:
    """How the run ended before its last epoch, if it did: ``{"after_epoch", "of_epochs",
    "by"}`` where ``by`` names the handler (an ``EarlyStopping`` of the kit's or the
    task's, with its patience), or None when it ran to its end or to ``--max-iters``."""
    epoch = trainer.state.epoch
    if epoch >= config.epochs or (config.max_iters is not None
                                  and trainer.state.iteration >= config.max_iters):
        return None
    stoppers = [h for engine in (evaluator, trainer) for handlers in engine._event_handlers.values()
                for h, _, _ in handlers if isinstance(h, EarlyStopping)]
    fired = [s for s in stoppers if s.counter >= s.patience]
    by = (f"EarlyStopping (patience {fired[0].patience})" if fired
          else "a handler (engine.terminate())")
    return {"after_epoch": epoch, "of_epochs": config.epochs, "by": by}


def _step_scheduler(scheduler):
    def step_lr_scheduler(engine):
        scheduler.step()

    return step_lr_scheduler


class Trainer(DeterministicEngine):
    """ignite's ``DeterministicEngine`` (a run resumed mid-epoch sees exactly the batches
    the uninterrupted run would have seen, with the same random state), whose checkpoint
    loads with ``torch.load(weights_only=True)``: numpy's generator state is stored as a
    tensor rather than a numpy array, which the safe unpickler refuses."""

    def state_dict(self):
        state = super().state_dict()
        state["rng_states"] = [_numpy_state_as_tensor(s) for s in state["rng_states"]]
        # A collective: the checkpoint is saved on every rank at once (ignite's Checkpoint)
        state[RNG_BY_RANK] = gather_rng_states()
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        by_rank = state_dict.pop(RNG_BY_RANK, None)
        self._cuda_rng_states = None
        if by_rank is not None and idist.get_rank() < len(by_rank):  # this rank's own streams
            mine = decode_rng_state(by_rank[idist.get_rank()])
            state_dict["rng_states"] = [mine["python"], mine["torch"], mine["numpy"]]
            self._cuda_rng_states = mine.get("cuda")
        state_dict["rng_states"] = [_numpy_state_from_tensor(s) for s in state_dict["rng_states"]]
        super().load_state_dict(state_dict)

    def _setup_engine(self):
        in_the_middle = self.state.rng_states is not None
        loader = self.state.dataloader
        if isinstance(loader, DataLoader) and loader.batch_sampler is not None and \
                not isinstance(loader.batch_sampler, ReproducibleBatchSampler):
            self.state.dataloader = resumable_loader(loader)
        super()._setup_engine()  # restores the CPU generators in the middle of an epoch
        cuda_states = getattr(self, "_cuda_rng_states", None)
        if cuda_states and in_the_middle and self.state.rng_states is None and \
                torch.cuda.is_available():
            torch.cuda.set_rng_state_all(cuda_states)
        self._cuda_rng_states = None


class DrawnOnce(ReproducibleBatchSampler):
    """ignite's ``ReproducibleBatchSampler`` (which puts a resumed epoch at its batch N),
    whose epoch order :class:`ResumableLoader` draws once, when ignite asks the loader for
    the epoch's batches, and which every iterator made from it then replays. Why:

    - drawn at the loader's ``iter()``, under the epoch's seed: ignite's sampler drew it at
      the first batch, from the generators a resumed run had put back by then, so a
      ``RandomSampler`` (one process has no ``DistributedSampler``) gave the resumed
      epoch another order;
    - replayed, not drawn again: a loader with worker processes asks for the sampler's
      iterator twice (torch's ``_MultiProcessingDataLoaderIter`` in its ``__init__`` and
      again in ``_reset``); the first used up "start at batch N" and the resumed epoch
      began again at its first batch."""

    def draw(self) -> None:
        self.setup_batch_indices()  # the whole order, less the batches already trained

    def __iter__(self):
        return iter(self.batch_indices)


class ResumableLoader(DataLoader):
    """A ``DataLoader`` whose batches resume exactly at any ``num_workers``, with or
    without persistent workers and prefetching (see :class:`DrawnOnce`)."""

    def __iter__(self):
        self.batch_sampler.draw()
        if not (self.persistent_workers and self.num_workers > 0):
            return super().__iter__()
        # Persistent workers are started (and their seed drawn) by the first iter() only:
        # drawn from a fork, the seed leaves the training's generator where a later epoch,
        # reusing its workers, leaves it, so a run resumed at an epoch's start goes on alike.
        with torch.random.fork_rng(devices=[]):
            return super().__iter__()


def resumable_loader(loader: DataLoader) -> ResumableLoader:
    """``loader`` with the same settings, as a :class:`ResumableLoader` (of the loader's
    own class too, when it is a subclass of ``DataLoader``), as ignite's
    ``update_dataloader`` rebuilds it."""
    cls = type(loader)
    kind = ResumableLoader if cls in (DataLoader, ResumableLoader) else \
        type(f"Resumable{cls.__name__}", (ResumableLoader, cls), {})
    params = {k: v for k, v in loader.__dict__.items() if not k.startswith("_") and
              k not in ("batch_size", "sampler", "drop_last", "batch_sampler", "dataset_kind")}
    return kind(batch_sampler=DrawnOnce(loader.batch_sampler), **params)


RNG_BY_RANK = "rng_by_rank"


def rng_state_bytes() -> torch.Tensor:
    """This process's generators (Python ``random``, numpy, torch CPU and CUDA) as bytes
    in a uint8 tensor that ``torch.load(weights_only=True)`` reads back."""
    import io
    import random

    import numpy as np

    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": _numpy_state_as_tensor(np.random.get_state())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def decode_rng_state(data: torch.Tensor) -> dict:
    """:func:`rng_state_bytes` read back (numpy's state still as a tensor)."""
    import io

    saved = io.BytesIO(data.numpy().tobytes())
    state = torch.load(saved, weights_only=True)
    state["python"] = (state["python"][0], tuple(state["python"][1]), state["python"][2])
    return state


def gather_rng_states() -> list:
    """Every rank's :func:`rng_state_bytes`, in rank order (a collective). Why gathered
    into rank 0's one checkpoint file rather than one small file per rank: the file is
    written whole and renamed into place, so a complete checkpoint always holds every
    rank's state; files per rank could be a mix of two saves after a kill, and on several
    nodes they would all need the shared folder anyway. Cost: ~12 KB a rank."""
    mine = rng_state_bytes()
    if idist.get_world_size() == 1:
        return [mine]
    lengths = [int(n) for n in idist.all_gather(int(mine.numel()))]
    padded = torch.zeros(max(lengths), dtype=torch.uint8)
    padded[:mine.numel()] = mine
    device = idist.device() if idist.backend() == "nccl" else torch.device("cpu")
    gathered = idist.all_gather(padded.to(device)).cpu().reshape(len(lengths), -1)
    return [gathered[r, :n].clone() for r, n in enumerate(lengths)]


def _numpy_state_as_tensor(state):
    if isinstance(state, tuple) and state and state[0] == "MT19937":
        return ("MT19937", torch.from_numpy(state[1].astype("int64")), *map(_plain, state[2:]))
    return state


def _numpy_state_from_tensor(state):
    if isinstance(state, (tuple, list)) and state and state[0] == "MT19937":
        import numpy as np

        return ("MT19937", state[1].numpy().astype(np.uint32), *state[2:])
    return state


def _plain(x):
    return x.item() if hasattr(x, "item") else x


def _jsonable(value):
    """A metric's value as results.json can hold it (a tensor metric becomes a list)."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    return value


def create_trainer(model, optimizer, criterion, config, prepare_batch=None, train_step=None):
    """A trainer whose step is written out, so a learner can read it.

    ``prepare_batch(batch, device, non_blocking) -> (x, y)`` (a task's own, as ignite's
    ``create_supervised_trainer`` takes it; default ``batch[0]``, ``batch[1]``) feeds the
    kit's step. ``train_step(model, optimizer, criterion, config) -> update(engine, batch)``
    (a task's own step, see :class:`distkit.Task`) replaces the kit's step; its output
    becomes the same ``{"loss": float, "batch_size": int, ...}`` (:func:`step_output`), so
    the mean train loss, the sample count and the progress bar work alike."""
    if train_step is not None:
        step = _task_step(model, optimizer, criterion, config, prepare_batch, train_step)
    else:
        step = _kit_step(model, optimizer, criterion, config, prepare_batch)
    return _with_train_loss(Trainer(step))


def _mark_step():
    """What ends a step on this device: XLA's ``mark_step`` (cut the lazy graph at the
    step's end and execute it), nothing elsewhere."""
    if idist.device().type == "xla":
        import torch_xla.core.xla_model as xm

        return xm.mark_step
    return lambda: None


def _task_step(model, optimizer, criterion, config, prepare_batch, train_step):
    """The task's own step, its output made the kit's (:func:`step_output`)."""
    device, mark_step = idist.device(), _mark_step()
    update = train_step(model, optimizer, criterion, config)
    if not callable(update):
        raise DistkitError(
            f"the task's train_step returned a {type(update).__name__}, not a function: "
            "return update(engine, batch), the step ignite's Engine runs")
    count_with = prepare_batch or prepare_xy
    if config.amp:  # --amp acts on a task's own step too: bfloat16 autocast around it
        own_update = update

        def update(engine, batch):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                return own_update(engine, batch)

    def own_step(engine, batch):
        if not model.training:
            model.train()
        output = update(engine, batch)
        mark_step()
        out = step_output(output, batch, count_with)
        engine.state.loss_sum += out["loss"]
        return out

    return own_step


def _kit_step(model, optimizer, criterion, config, prepare_batch):
    """The kit's step: prepare, forward, zero_grad, backward, optimizer step."""
    device, mark_step = idist.device(), _mark_step()
    # Decided once, not at every step: a disabled autocast context and a model.train()
    # (a walk over every module) on every step are a large share of a step's fixed cost.
    if config.amp:
        def forward(x, y):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                return criterion(model(x), y)
    else:
        def forward(x, y):
            return criterion(model(x), y)

    if prepare_batch is None:
        def prepare(batch):
            return batch[0].to(device, non_blocking=True), batch[1].to(device, non_blocking=True)
    else:
        def prepare(batch):
            return prepare_batch(batch, device, True)

    def backward(loss):
        loss.backward()  # under DDP this also all-reduces (averages) the gradients

    optimizer_step = optimizer.step
    if getattr(config, "trace", False):  # --trace: each phase a range of the profiler's trace
        forward, backward = tracing.ranged("forward", forward), tracing.ranged("backward", backward)
        optimizer_step = tracing.ranged("optimizer step", optimizer.step)

    def train_step(engine, batch):
        if not model.training:  # validation left it in eval mode; checking is ~free
            model.train()
        x, y = prepare(batch)
        loss = forward(x, y)
        optimizer.zero_grad(set_to_none=True)
        backward(loss)
        optimizer_step()
        mark_step()
        value = loss.item()  # .item(): a device sync point
        engine.state.loss_sum += value
        return {"loss": value, "batch_size": len(y)}

    return train_step


def step_output(output, batch, prepare_batch) -> dict:
    """What a task's ``update`` returned, as the kit's step returns it: ``{"loss": float,
    "batch_size": int, ...}``. ``output`` is the loss (a number or a one-element tensor)
    or a dict with ``"loss"`` and optionally ``"batch_size"`` (else ``len(y)`` of
    ``prepare_batch(batch, None, False)``, which moves nothing) and keys of its own::

        >>> import torch
        >>> from distkit.tasks import prepare_xy
        >>> step_output(torch.tensor(0.5), (torch.zeros(4, 2), torch.zeros(4)), prepare_xy)
        {'loss': 0.5, 'batch_size': 4}
    """
    out = dict(output) if isinstance(output, dict) else {"loss": output}
    if "loss" not in out:
        raise DistkitError(f"the task's train_step returned a dict without 'loss' (keys: "
                           f"{', '.join(map(str, out))}): return {{'loss': loss, ...}} or the loss")
    loss = out["loss"]
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        loss = loss.item()  # a device sync point, as in the kit's own step
    if isinstance(loss, bool) or not isinstance(loss, (int, float)):
        raise DistkitError(f"the task's train_step returned a loss of type {type(loss).__name__}: "
                           "return the batch's loss as a number or a one-element tensor")
    out["loss"] = float(loss)
    if "batch_size" not in out:
        out["batch_size"] = len(prepare_batch(batch, None, False)[1])
    return out


def _with_train_loss(trainer):
    # The epoch's mean batch loss over all ranks, all-reduced once at the epoch's end (a
    # RunningAverage would all-reduce at every iteration: ~20% of a step here). This is
    # what ignite's Average metric computes; its per-step update (output transform,
    # checks, a tensor add) costs tens of microseconds a step, a sum of floats far less
    # (benchmarks/README.md).
    @trainer.on(Events.EPOCH_STARTED)
    def reset_loss_sum(engine):
        engine.state.loss_sum = 0.0
        # a run resumed mid-epoch starts its first epoch late: fewer batches in the mean
        engine.state.epoch_start_iteration = engine.state.iteration

    @trainer.on(Events.EPOCH_COMPLETED)
    def mean_train_loss(engine):
        steps = idist.all_reduce(float(engine.state.iteration - engine.state.epoch_start_iteration))
        engine.state.metrics["train_loss"] = idist.all_reduce(engine.state.loss_sum) / max(steps, 1)

    return trainer


def inside_epochs_every(n: int):
    """An ignite event filter: every ``n``-th iteration, except an epoch's last. That
    iteration's checkpoint is written at the epoch's end, after validation, early
    stopping, the best model and a per-epoch schedule's step: a file of that iteration
    written before them would be the newest, valid file of a run killed meanwhile, and
    the resumed run would skip the epoch's validation and step its schedule late."""
    def event_filter(engine, iteration: int) -> bool:
        return iteration % n == 0 and iteration % engine.state.epoch_length != 0

    return event_filter


def at_most_every(seconds: float):
    """An ignite event filter that lets an iteration event through at most every
    ``seconds`` (and always at an epoch's last iteration). The progress bar redrawn at
    every step cost ~400 us a step here; tqdm shows at most 10 redraws a second anyway::

        ProgressBar().attach(trainer, event_name=Events.ITERATION_COMPLETED(
            event_filter=at_most_every(0.1)))
    """
    last = [float("-inf")]

    def event_filter(engine, event):
        now = time.perf_counter()
        if now - last[0] >= seconds or engine.state.iteration % engine.state.epoch_length == 0:
            last[0] = now
            return True
        return False

    return event_filter


def attach_step_handlers(trainer, train_loader, lr_scheduler=None, event=Events.ITERATION_STARTED):
    """The handlers every epoch or step of training needs: the lr schedule (if given; at
    ``event``, see :func:`task_lr_scheduler`), the sampler's reshuffle, and
    ``trainer.state.samples``, the samples this process trained on since ``run()``
    started. ``benchmarks`` reuse it to time the same work."""
    if lr_scheduler is not None and event is not None:
        from ignite.handlers import ParamScheduler

        handler = lr_scheduler if isinstance(lr_scheduler, ParamScheduler) else \
            _step_scheduler(lr_scheduler)
        trainer.add_event_handler(event, handler)

    @trainer.on(Events.EPOCH_STARTED)
    def reshuffle(engine):
        # Without this every epoch would see the same order on every rank.
        sampler = getattr(train_loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(engine.state.epoch - 1)

    @trainer.on(Events.STARTED)
    def reset_count(engine):
        engine.state.samples = 0

    @trainer.on(Events.ITERATION_COMPLETED)
    def count_samples(engine):
        engine.state.samples += engine.state.output["batch_size"]


def create_evaluator(model, criterion, config, task: Task | None = None):
    """The task's metrics and its loss over the validation shard of each rank; ignite's
    metrics all-reduce their counts, so every rank gets the global values. The task's
    ``prepare_batch`` (default :func:`~distkit.tasks.prepare_xy`) makes ``(x, y)``."""
    task = resolve_task(task if task is not None else config)
    metrics = task.build_metrics(criterion)
    return create_supervised_evaluator(
        model, metrics=metrics, device=idist.device(), non_blocking=True,
        prepare_batch=task.prepare_batch or prepare_xy,
        amp_mode="amp" if config.amp and idist.device().type == "cuda" else None)


def resolve_run_dir(config, run_dir: str | None = None) -> str:
    """The run folder: ``run_dir`` if the launcher made it already (spawn, on node 0),
    else rank 0 makes one under ``config.output_dir``; every rank learns its name."""
    run_dir = run_dir or ""
    if idist.get_rank() == 0 and not run_dir:
        run_dir = make_run_dir(config.output_dir, idist.backend() or "none", idist.get_world_size())
    # Every rank takes part, even where the launcher set run_dir: with --nnodes 2 only
    # node 0's launcher made the folder, and node 1's ranks must learn its name.
    return broadcast_text(run_dir, src=0)  # a name in any script (idist.broadcast's is ASCII)


def param_digest(model) -> str:
    """A SHA-256 of every parameter and buffer, bit for bit: equal digests on two ranks
    mean identical replicas."""
    import hashlib

    h = hashlib.sha256()
    # DDP keeps the user's model in .module; FSDP's shards are gathered (a collective)
    for name, tensor in full_state_dict_everywhere(model).items():
        h.update(name.encode())
        h.update(tensor.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def replica_digests(model) -> list:
    """Every rank's :func:`param_digest`, in rank order (a collective: call on all ranks)."""
    return list(idist.all_gather(param_digest(model)))


def training(local_rank: int, config, task: Task | None = None,
             run_dir: str | None = None) -> dict | None:
    """Train ``task`` (default: ``config.task``, else the built-in task of
    ``config.dataset`` x ``config.model``) in this process, as one of
    ``idist.get_world_size()`` replicas. Returns the results on rank 0 (also written to
    ``<run_dir>/results.json``), ``None`` on the other ranks. ``run_dir``: the run folder
    a launcher made for it (None: rank 0 makes one under ``config.output_dir``).

    Launchers call it; to start it yourself use :func:`distkit.launch.entry.run`, which spawns
    processes or joins torchrun/SLURM. In one plain process (no process group)::

        >>> from distkit import Config
        >>> from distkit.train.training import training
        >>> cfg = Config(backend="none", model="mlp", epochs=1, progress_bar=False,
        ...              output_dir="runs/doc")
        >>> results = training(0, cfg)  # doctest: +ELLIPSIS
        epoch   1  train loss ...
        >>> sorted(results["final"])
        ['epoch', 'epoch_time_s', 'lr', 'train_loss', 'train_loss_iterations', 'val_accuracy', 'val_loss']
    """
    task = resolve_task(task if task is not None else config)
    config = task.configure(config)  # the task's own settings, complete and typed
    # every rank trains what rank 0 trains, or none does (before anything is written):
    # the last of distkit.launch.checks' checks, the one that needs the process group
    check_in_ranks(config, task)
    run_dir = resolve_run_dir(config, run_dir)
    training_in(run_dir)  # a failure from here on names this run's folder and checkpoint
    signals.clear()  # a stop asked of an earlier run in this process is not this run's
    restore_handlers = signals.install(stop_signals())
    stopped = None
    try:
        results = _train(local_rank, config, task, run_dir)
    except signals.Preempted as e:  # every rank stopped at one iteration: they leave together
        stopped = e.with_traceback(None)  # its frames hold the run, which must be freed first
    finally:
        restore_handlers()
    _leave_together()
    if stopped is not None:
        raise stopped
    training_in(None)
    return results


def _leave_together() -> None:
    # Free the trainer, the DDP model and the loaders (held by reference cycles) now, while
    # the interpreter and the process group are alive: left to the interpreter's exit,
    # gloo's pending work objects can abort a process that has finished its work
    # (SIGABRT, "terminate called without an active exception").
    gc.collect()
    idist.barrier()  # leave together: a rank that tears down early can abort the others


def stop_signals() -> tuple:
    """The signals that stop training at the next iteration with a checkpoint: SIGTERM
    and SIGUSR1; SIGINT too in a rank of torchrun / srun, which pass a Ctrl-C on to their
    ranks (the kit's own launcher stops its workers itself)."""
    import signal

    extra = (signal.SIGINT,) if world_layout().launcher != "none" else ()
    return signals.STOP_SIGNALS + extra


class History:
    """Every validated epoch's record (``results.json``'s ``history``, the list it wraps),
    kept in the checkpoint: a resumed run reports, plots and picks its best epoch over the
    whole run, as the uninterrupted one does, not over the epochs since it resumed. (A
    wrapper, not a list subclass: ignite's Checkpoint treats sequences item by item.)"""

    def __init__(self, records: list):
        self.records = records

    def state_dict(self) -> dict:
        return {"epochs": list(self.records)}

    def load_state_dict(self, state: dict) -> None:  # epochs the run before trained
        self.records[:] = [{**h, "before_resume": True} for h in state["epochs"]]


def resumable_state(stopper, best, task: Task, trainer, evaluator, config) -> dict:
    """What the checkpoint holds beside trainer, model, optimizer and schedule, so that a
    resumed run decides as the uninterrupted one: early stopping's counter and best score,
    the best model's score and file, and the objects of the task's own
    (``Task.stateful``, each under ``task.<name>``)."""
    objects = {"best_model": best}
    if stopper is not None:
        objects["early_stopping"] = stopper
    if task.stateful is not None:
        own = task.stateful(trainer, evaluator, config) or {}
        for name, obj in own.items():
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise DistkitError(
                    f"task {task.name!r}: its stateful() returned {name!r}, a "
                    f"{type(obj).__name__} without state_dict/load_state_dict: return only "
                    "objects that have both (ignite handlers and metrics, torch modules, "
                    "optimizers and schedulers do)")
            objects[f"task.{name}"] = obj
    return objects


def resume_objects(objects: dict, config, run_dir: str) -> None:
    """Load ``objects`` from ``config.resume_from`` (those it holds: a checkpoint of an
    older distkit lacks early stopping's state), bring the best model's file into this
    run's folder, and say in one line what cannot be resumed exactly."""
    import shutil
    import sys

    # another world size, nodes or strategy: resharded as it loads (distkit.checkpoint.reshard)
    ckpt = adapt_checkpoint(load_checkpoint(config.resume_from), objects, config.resume_from)
    Checkpoint.load_objects({k: v for k, v in objects.items() if k in ckpt}, ckpt)
    rank = idist.get_rank()
    if "best_model" in ckpt and rank == 0:  # the tracker names a file of the old run
        old_best = os.path.join(os.path.dirname(os.path.dirname(config.resume_from)), "best")
        for _, filename in ckpt["best_model"].get("_saved", []):
            source = os.path.join(old_best, filename)
            if os.path.exists(source):
                os.makedirs(os.path.join(run_dir, "best"), exist_ok=True)
                for name in (filename, filename + ".sha256"):  # the file and its proof
                    if os.path.exists(os.path.join(old_best, name)):
                        shutil.copy2(os.path.join(old_best, name), os.path.join(run_dir, "best", name))
    trainer_state = ckpt["trainer"]
    mid_epoch = trainer_state["iteration"] % trainer_state["epoch_length"] != 0
    if rank == 0 and mid_epoch and config.num_workers > 0:
        print(f"distkit: note: resuming in the middle of an epoch with --num-workers "
              f"{config.num_workers}: the batches, their order and the training's generators "
              "go on exactly; only random numbers drawn inside the loader's worker processes "
              "(a random augmentation in the dataset or collate_fn, if it has one) are drawn "
              "afresh for the rest of this epoch", file=sys.stderr, flush=True)
    if rank == 0 and mid_epoch and RNG_BY_RANK not in trainer_state and idist.get_world_size() > 1:
        print("distkit: note: this checkpoint holds rank 0's random state only (an older "
              "distkit): dropout on the other ranks differs from an uninterrupted run until "
              "the epoch ends", file=sys.stderr, flush=True)


class Run:
    """One training run's collaborators (data, model, engines, schedule, checkpoints,
    what it reports), built in the order they depend on each other by :func:`_train`.
    Each ``attach_*`` method adds one concern's handlers to the engines."""

    def __init__(self, config, task: Task, run_dir: str):
        self.config, self.task, self.run_dir = config, task, run_dir
        self.rank, self.world_size = idist.get_rank(), idist.get_world_size()
        self.show_bar = tracking.console(config)  # a bar only where someone watches
        self.history: list = []
        self.train_loader, self.val_loader = get_dataflow(config, task.datasets(config),
                                                          task.collate_fn)
        self.model, self.optimizer, self.criterion = initialize(config, task)
        self.initial_digests = replica_digests(self.model)
        self.lr_scheduler, self.lr_event = task_lr_scheduler(task, config, self.optimizer,
                                                             len(self.train_loader))
        self.trainer = create_trainer(self.model, self.optimizer, self.criterion, config,
                                      task.prepare_batch, task.train_step)
        self.evaluator = create_evaluator(self.model, self.criterion, config, task)
        # a NaN or inf stops every rank before it is validated or saved (distkit.train.finite)
        self.guard = FiniteGuard(self.model, self.last_checkpoint) \
            if task.stop_on_non_finite else None
        self.checkpoint = None

    def attach_step(self) -> None:
        """The lr schedule per step, the sampler's reshuffle, the counts, tokens/s and MFU."""
        config, trainer = self.config, self.trainer
        # a torch scheduler steps at the epoch's end, after validation (which records the
        # epoch's lr) and before the checkpoint (which must hold the stepped state)
        attach_step_handlers(trainer, self.train_loader, self.lr_scheduler,
                             None if self.lr_event == Events.EPOCH_COMPLETED else self.lr_event)
        planned = config.epochs * len(self.train_loader)
        self.lr_trace = LrTrace(self.optimizer, min(planned, config.max_iters or planned)).attach(trainer)
        self.clock = throughput.attach(trainer, self.model, config)  # if the model counts FLOPs
        if self.clock is None and config.peak_flops:
            raise DistkitError(
                f"--peak-flops: the model of task {self.task.name!r} does not count its FLOPs "
                "(no flops_per_token() and block_size), so there is no MFU to measure "
                "against it: drop --peak-flops")
        self.profiler = profiling.attach(trainer) if config.profile else None

    def attach_validation(self) -> None:
        """Validation at every epoch's end, its record in ``history``, then a per-epoch
        schedule's step."""
        if self.guard is not None:  # NaN weights are neither validated nor judged best
            self.trainer.add_event_handler(Events.EPOCH_COMPLETED, self.guard.check)
        self.trainer.add_event_handler(Events.EPOCH_COMPLETED, self.validate)
        if self.lr_event == Events.EPOCH_COMPLETED:
            self.trainer.add_event_handler(self.lr_event, _step_scheduler(self.lr_scheduler))

    def validate(self, engine) -> None:
        state = self.evaluator.run(self.val_loader)
        self.history.append({
            "epoch": engine.state.epoch,
            "train_loss": engine.state.metrics["train_loss"],
            # batches in train_loss's mean (create_trainer marks where the epoch started)
            "train_loss_iterations": engine.state.iteration - engine.state.epoch_start_iteration,
            **{f"val_{name}": _jsonable(value) for name, value in state.metrics.items()},
            "epoch_time_s": engine.state.times["EPOCH_COMPLETED"],
            "lr": self.optimizer.param_groups[0]["lr"],
        })
        if self.rank == 0 and not self.show_bar:
            h = self.history[-1]
            shown = "  ".join(f"{k[4:].replace('accuracy', 'acc')} {h[k]:.4f}" for k in h
                              if k.startswith("val_") and isinstance(h[k], float))
            print(f"epoch {h['epoch']:3d}  train loss {h['train_loss']:.4f}  val {shown}  "
                  f"({h['epoch_time_s']:.2f} s)", flush=True)

    def score(self, engine) -> float:
        """The task's score in the evaluator's metrics, signed so that larger is better
        (what ignite's handlers want)."""
        return self.task.sign() * float(engine.state.metrics[self.task.score[0]])

    def attach_judges(self) -> None:
        """Early stopping and the best model. They read the evaluator's metrics when it
        completes, as ignite's examples attach them: not before the validation they judge."""
        config, task = self.config, self.task
        self.stopper = None
        if config.early_stopping_patience > 0:
            self.stopper = EarlyStopping(
                patience=config.early_stopping_patience, threshold=config.early_stopping_min_delta,
                score_function=self.score, trainer=self.trainer)
            self.evaluator.add_event_handler(Events.COMPLETED, self.stopper)
        # Checkpoint must exist on every rank (XLA saves collectively); DiskSaver writes on
        # rank 0 only, atomically (temporary file, then rename). Under fsdp: full
        # (unsharded) state dicts, so the files stay plain model weights.
        self.saved_model, self.saved_optimizer = checkpoint_objects(self.model, self.optimizer)
        # The best model by the task's score, beside (not among) the resumable checkpoints.
        # Its file name carries the metric as measured (best_model_loss=0.0871.pt), not the
        # signed score ignite ranks by, which is negative for a "min" metric.
        self.best = Checkpoint(
            {"model": self.saved_model}, checkpoint_saver(os.path.join(self.run_dir, "best")),
            filename_prefix="best", n_saved=1, score_function=self.score, score_name=task.score[0],
            filename_pattern="{filename_prefix}_{name}_{score_name}={global_step}.{ext}",
            global_step_transform=lambda engine, _: f"{float(engine.state.metrics[task.score[0]]):.4f}")
        self.evaluator.add_event_handler(Events.COMPLETED, self.best)

    def attach_checkpoints(self) -> None:
        """The resumable checkpoint (every ``--checkpoint-every`` iterations and at every
        epoch's end) and the stop at a signal or ``--max-iters`` with its checkpoint."""
        config, task, trainer = self.config, self.task, self.trainer
        # the settings a resumed run must share with this one (checked before it starts)
        settings = RunSettings(resume_settings(config, task.name, self.world_size,
                                               type(self.optimizer).__name__))
        objects = to_save(trainer, self.saved_model, self.saved_optimizer, self.lr_scheduler,
                          settings)
        # resumed as they were: early stopping's counter, the best model's score, the task's own
        objects.update(resumable_state(self.stopper, self.best, task, trainer, self.evaluator,
                                       config))
        objects["history"] = History(self.history)  # a resumed run's results: every epoch
        self.objects = objects
        self.checkpoint = checkpoint = Checkpoint(
            objects, checkpoint_saver(os.path.join(self.run_dir, "checkpoints")),
            filename_prefix=CHECKPOINT_PREFIX, n_saved=2,
            global_step_transform=lambda engine, _: engine.state.iteration)
        save_at = Events.EPOCH_COMPLETED
        if config.checkpoint_every > 0:
            save_at = save_at | Events.ITERATION_COMPLETED(
                event_filter=inside_epochs_every(config.checkpoint_every))
        trainer.add_event_handler(save_at, self.save)
        # a stop signal or --max-iters: every rank at the same iteration, after the epoch's
        # validation and schedule step when that iteration ends an epoch (distkit.train.stopping)
        self.stop = stopping.attach(trainer, self.save_now, config.max_iters, self.guard)

    def save(self, engine) -> None:
        """Write the resumable checkpoint of this iteration, if every rank is finite."""
        if self.guard is not None:
            self.guard.check(engine)
        self.checkpoint(engine)

    def save_now(self, engine) -> str | None:
        """The checkpoint of this iteration (written once), as a path to name."""
        if checkpoint_iteration(self.checkpoint.last_checkpoint or "") != engine.state.iteration:
            self.save(engine)
        return self.last_checkpoint()

    def last_checkpoint(self) -> str | None:
        """The newest resumable checkpoint this run wrote (None: none yet)."""
        return saved_path(self.run_dir, "checkpoints", self.checkpoint) if self.checkpoint else None

    def attach_display(self) -> None:
        """The progress bar, the first step's time, ``--trace`` and ``--logger``."""
        config, trainer = self.config, self.trainer

        @trainer.on(Events.ITERATION_COMPLETED(once=1))
        def first_step_done(engine):  # start-up as a learner feels it (distkit bench's peers)
            engine.state.first_step_unix_s = time.time()

        if self.rank == 0 and self.show_bar:
            # rank 0's own batch loss: showing it needs no communication
            ProgressBar(persist=False).attach(
                trainer, output_transform=lambda out: {"loss": out["loss"]},
                event_name=Events.ITERATION_COMPLETED(event_filter=at_most_every(0.1)))
        self.tracer = tracing.attach(trainer, self.evaluator, self.run_dir,
                                     _planned_steps(config, self.train_loader)) \
            if config.trace else None
        self.tracker = tracking.attach(config, trainer, self.evaluator, self.optimizer,
                                       self.run_dir)  # --logger, rank 0

    def train(self) -> float:
        """Train; the wall time. A stop signal raises :class:`~distkit.train.signals.Preempted`
        (every rank at the same iteration, with its checkpoint)."""
        start = time.perf_counter()
        self.trainer.run(self.train_loader, max_epochs=self.config.epochs)
        wall = time.perf_counter() - start
        stop = self.stop
        if stop.stopped and stop.signum:  # stopped by a signal: the checkpoint says where
            self.tracker.close(None)
            raise signals.Preempted(
                signals.stopped_line(stop.signum, stop.iteration, stop.epoch, stop.checkpoint),
                stop.signum, stop.checkpoint)
        return wall

    def extras(self) -> dict:
        """results.json's fields beyond the history: throughput, schedule, optimizer, step.
        On every rank: a task's summary may run the model (a collective under fsdp)."""
        config, task, optimizer = self.config, self.task, self.optimizer
        return {**throughput.report(self.clock),
                "task_summary": task.summary(self.model, config) if task.summary else None,
                # kit: --lr and its schedule; none: the optimizer's own lr; task: its scheduler
                "lr_schedule": schedule_kind(task), "lr_scheduler": scheduler_name(self.lr_scheduler),
                "scheduler_step": scheduler_step(task, self.lr_event),
                "lr_trace": self.lr_trace.record(),
                "optimizer": {"type": type(optimizer).__name__,
                              **{k: _jsonable(v) for k, v in optimizer.defaults.items()
                                 if isinstance(v, (int, float, bool, str, torch.Tensor))}},
                "train_step": "task" if task.train_step is not None else "kit",
                "amp": "bfloat16 autocast" if config.amp else None,
                # a NaN or inf loss or weight: "stop" the run, or "train on" (the task's choice)
                "non_finite": "stop" if task.stop_on_non_finite else "train on",
                "stopped_early": stopped_early(self.trainer, self.evaluator, config)}

    def report(self, wall: float) -> dict | None:
        """results.json and the plot (rank 0), the tracker's files, the replicas compared."""
        config, task, trainer, run_dir = self.config, self.task, self.trainer, self.run_dir
        profile = profiling.summarize(self.profiler) if self.profiler is not None else None
        trace = self.tracer.finish() if self.tracer is not None else None  # a collective
        digests = {"initial": self.initial_digests, "final": replica_digests(self.model)}
        memory = peak_memory_per_rank()
        extras = self.extras()
        if trace is not None:
            extras["trace"] = trace
        record = RunRecord(
            run_dir=run_dir, config=config, task=task, settings=effective_config(config, task),
            history=self.history, iterations=trainer.state.iteration,
            samples_trained=trainer.state.samples * self.world_size, wall_time_s=wall,
            first_step_unix_s=getattr(trainer.state, "first_step_unix_s", None),
            peak_lr=peak_lr(config, self.world_size) if schedule_kind(task) == "kit" else None,
            last_checkpoint=self.last_checkpoint(),
            best_model=saved_path(run_dir, "best", self.best), profile=profile,
            replica_digests=digests, peak_memory_per_rank=memory, extras=extras)
        results = report(record) if self.rank == 0 else None  # rank 0 writes results.json
        if self.rank == 0:  # the tracker is optional: after results.json, a failure is a warning
            from distkit.observe.reporting import optional_output

            optional_output(f"the --logger {config.logger} files", run_dir,
                            lambda: self.tracker.close(profile))
        check_replicas_identical(digests)  # on every rank: replicas apart are an error
        return results


def _train(local_rank: int, config, task: Task, run_dir: str) -> dict | None:
    """Build the run, attach its handlers in the order they must fire, resume, train, report."""
    torch.set_num_threads(config.threads_per_process or threads_per_process(ranks_on_this_host()))
    run = Run(config, task, run_dir)
    run.attach_step()
    run.attach_validation()
    run.attach_judges()
    if task.handlers is not None:  # the task's own, after the kit's, before the checkpoint
        task.handlers(run.trainer, run.evaluator, config)
    run.attach_checkpoints()
    if config.resume_from:
        resume_objects(run.objects, config, run_dir)
    run.attach_display()
    return run.report(run.train())


def _planned_steps(config, train_loader) -> int | None:
    """The steps this run will train (None: unknown), so that --trace records within them."""
    try:
        steps = config.epochs * len(train_loader)
    except TypeError:  # a loader without a length
        return config.max_iters
    return min(steps, config.max_iters) if config.max_iters else steps
