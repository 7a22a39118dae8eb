"""Resume on another layout: a checkpoint written by N processes (on some nodes, under
``ddp`` or ``fsdp``) resumed by M processes, or under the other strategy.

Why this works without files per rank: a distkit checkpoint already holds the *full*
(unsharded) state, gathered by ``torch.distributed.checkpoint.state_dict``
(``full_state_dict=True``) under fsdp and by ignite from ``model.module`` under ddp, in
one file proven by its checksum before it is read. Loading it on another layout is what
``set_model_state_dict`` / ``set_optimizer_state_dict`` do with a full state dict: every
rank keeps its own shard of it (fsdp) or the whole of it (ddp). The one difference
between the strategies is how the optimizer's state is keyed: ``optimizer.state_dict()``
(ddp) numbers the parameters 0, 1, ...; ``get_optimizer_state_dict`` (fsdp) names them
(``fc1.weight``). :func:`adapt_checkpoint` renames one into the other, by the order in
which the optimizer holds the parameters, the same on both sides.

The data position: with ``DistributedSampler`` (``distkit.builtin.data`` uses it at every
world size, one process included) the epoch's order is ``perm = randperm(N)`` under the
sampler's seed and epoch, whatever the world size W; rank r takes ``perm[r::W]`` in
batches of B/W, so global batch i is ``perm[i*B:(i+1)*B]`` at any W dividing B. The
trainer's iteration in the checkpoint therefore points at the same global batch on the
new layout, and ignite's ``DeterministicEngine`` skips to it. (Padding: when N does not
divide by W the sampler repeats a few samples in the epoch's last batch, which then
differs with W; every other batch is the same.)
"""
from __future__ import annotations

from distkit.errors import DistkitError

# What describes where a checkpoint was written (RunSettings' keys)
LAYOUT = ("world_size", "nnodes", "strategy")


def layout_of(settings: dict) -> dict:
    """``{"world_size", "nnodes", "strategy"}`` of a checkpoint's (or a run's) settings;
    None where an older checkpoint did not record it."""
    return {key: settings.get(key) for key in LAYOUT}


def layout_changed(saved: dict, current: dict) -> bool:
    """True if the run resumes on another world size, number of nodes or strategy than
    the checkpoint's (a key either side lacks is not compared)."""
    return any(saved.get(k) is not None and current.get(k) is not None and saved[k] != current[k]
               for k in LAYOUT)


def check_task_state_reshards(path: str, objects: dict, saved: dict) -> None:
    """The one check of a layout change that only the running ranks can make (the other,
    a global batch that divides by the new world size, is ``Config.check_batch_fits``,
    before any process starts). Refuse a layout change for a task whose own state says
    it belongs to one layout (an object of ``Task.stateful`` with ``reshardable =
    False``: a count per rank, a buffer per shard); the checkpoint holds rank 0's copy
    only, which another layout would silently misread."""
    stuck = [name[len("task."):] for name, obj in objects.items()
             if name.startswith("task.") and getattr(obj, "reshardable", True) is False]
    if stuck:
        raise DistkitError(
            f"--resume-from {path!r}: the task's state {', '.join(stuck)} is kept per rank and "
            f"cannot move to another layout: resume on the checkpoint's {saved.get('world_size')} "
            f"processes ({saved.get('nnodes')} node(s), --strategy {saved.get('strategy')}), or make "
            "that state the same on every rank")


def parameter_names(objects: dict) -> list[str]:
    """The names of the parameters in the order the run's optimizer holds them (group by
    group): the numbering of ``optimizer.state_dict()``."""
    model, optimizer = objects["model"], objects["optimizer"]
    model = getattr(model, "model", model)  # FullModelState (fsdp) holds the model
    optimizer = getattr(optimizer, "optimizer", optimizer)  # FullOptimizerState likewise
    model = getattr(model, "module", model)  # DDP's wrapped model
    by_id = {id(p): name for name, p in model.named_parameters()}
    return [by_id[id(p)] for group in optimizer.param_groups for p in group["params"]]


def named_optimizer_state(state: dict, names: list[str]) -> dict:
    """``optimizer.state_dict()`` (parameters numbered) keyed by parameter name, as
    ``get_optimizer_state_dict`` keys it."""
    return {"state": {names[i]: s for i, s in state["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]}
                             for g in state["param_groups"]]}


def numbered_optimizer_state(state: dict, names: list[str]) -> dict:
    """The inverse of :func:`named_optimizer_state`."""
    index = {name: i for i, name in enumerate(names)}
    return {"state": {index[n]: s for n, s in state["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]}
                             for g in state["param_groups"]]}


def _keyed_by_name(state: dict) -> bool:
    params = [p for g in state.get("param_groups", []) for p in g.get("params", [])]
    return any(isinstance(p, str) for p in params)


def adapt_checkpoint(ckpt: dict, objects: dict, path: str) -> dict:
    """``ckpt`` as this run's ``objects`` load it: the optimizer's state keyed the way
    this run's strategy keys it, after checking a layout change is one that can hold
    (:func:`check_task_state_reshards`). A checkpoint of this run's own layout is
    returned unchanged (the same bytes load: a same-layout resume stays bit-identical)."""
    saved, current = ckpt.get("settings") or {}, objects["settings"].settings
    if not layout_changed(saved, current):
        return ckpt
    check_task_state_reshards(path, objects, saved)
    state = ckpt["optimizer"]
    wants_names = hasattr(objects["optimizer"], "model")  # FullOptimizerState: fsdp
    if wants_names != _keyed_by_name(state):
        names = parameter_names(objects)
        convert = named_optimizer_state if wants_names else numbered_optimizer_state
        ckpt = {**ckpt, "optimizer": convert(state, names)}
    return ckpt


def resumed_from(path: str, ckpt: dict) -> dict:
    """``results.json``'s ``resumed_from``: the checkpoint ``path`` (loaded: ``ckpt``), the
    iteration it holds, and the layout it was written on (world size, nodes, strategy)."""
    return {"checkpoint": str(path), "iteration": ckpt["trainer"]["iteration"],
            **layout_of(ckpt.get("settings") or {})}
