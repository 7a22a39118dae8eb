"""Checks for exercise 10: the bytes each rank holds after one Adam step, measured under
DDP and under the learner's FSDP sharding, against the learner's prediction, on 2 and 3
processes and on 2 nodes x 2 processes; the prediction against the reference solution's
for world sizes 1 to 8. One process has no FSDP (``fully_shard`` needs a process group):
there only the prediction is judged."""
import random
import sys

import pytest
import torch
import torch.nn as nn

import harness

pytestmark = pytest.mark.ex10

WORLD = 2
KINDS = ("params", "grads", "optimizer")


DIMS = {2: (16, 32, 32, 8), 3: (12, 24, 24, 12), 4: (12, 24, 24, 12)}  # rows divide by the world


def make_model(world=WORLD, scale=1):
    """Three nn.Linear layers, the middle one inside a nested block (models are rarely
    flat: a walk must reach every level), ``scale`` times as wide as :data:`DIMS` says."""
    torch.manual_seed(0)  # every layer's first dimension divides by the world size: equal shards
    a, b, c, d = (scale * n for n in DIMS[world])
    return nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Sequential(nn.Linear(b, c), nn.ReLU()),
                         nn.Linear(c, d))


def drawn(seed) -> tuple:
    """What the seed chooses: how wide the measured models are, and the number of
    parameters the predictions for world sizes 1 to 8 are asked about (it divides by each)."""
    rng = random.Random(seed)
    return rng.randint(1, 3), 840 * rng.randint(1, 24)


def params_of(model) -> int:
    return sum(p.numel() for p in model.parameters())


def one_adam_step(model):
    from distkit.lessons.sharded import state_bytes

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(8, getattr(model, "module", model)[0].in_features, generator=torch.Generator().manual_seed(1))
    out = model(x)
    out.pow(2).mean().backward()
    optimizer.step()
    return out.detach(), state_bytes(model, optimizer)


def on_rank(whos, scale):
    """What this rank measures: for the reference, the run's facts (world size, the model's
    size, the plain DDP step's bytes and output) and the reference's predictions; for the
    learner, the learner's predictions and what their ``shard`` leaves on this rank."""
    import ignite.distributed as idist

    world = idist.get_world_size()
    num_params = params_of(make_model(world, scale))
    found = {}
    if harness.LEARNER in whos:  # the learner's predictions first, as a learner reads them
        ex = harness.load("10")
        found[harness.LEARNER] = harness.plain({
            "predicted": {s: ex.predict_bytes_per_rank(num_params, world, s) for s in ("ddp", "fsdp")},
            "predicted_fsdp_4": ex.predict_bytes_per_rank(params_of(make_model(WORLD, scale)), 4, "fsdp"),
            "probes": probed(ex)})
    if harness.REFERENCE in whos:
        reference = harness.load_reference("10")
        ddp_out, ddp = one_adam_step(idist.auto_model(make_model(world, scale)))
        found[harness.REFERENCE] = {
            "world": world, "num_params": num_params, "ddp": ddp, "ddp_out": ddp_out,
            "reference": {s: reference.predict_bytes_per_rank(num_params, world, s) for s in ("ddp", "fsdp")},
            "largest_layer": max(4 * params_of(m) for m in make_model(world, scale).modules()
                                 if isinstance(m, nn.Linear)),
            "probes": probed(reference)}
    if harness.LEARNER in whos:
        found[harness.LEARNER].update(sharded_run(harness.load("10"), world, scale))
    return found


def probed(module) -> dict:
    """``module``'s predictions at :data:`PROBES`, per strategy (None where a call raised)."""
    values = {}
    for strategy in ("ddp", "fsdp"):
        values[strategy] = []
        for n, world in PROBES:
            try:
                values[strategy].append(harness.plain(module.predict_bytes_per_rank(n, world, strategy)))
            except Exception:  # noqa: BLE001 - an answer that fails a probe follows no slip
                values[strategy].append(None)
    return values


def sharded_run(ex, world, scale) -> dict:
    """How the learner's ``shard`` left the model on this rank, and one Adam step's bytes."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    report = {}
    sharded = ex.shard(make_model(world, scale))
    if not isinstance(sharded, nn.Module):
        report["returned"] = type(sharded).__name__
        return report
    report["whole"] = [name for name, p in sharded.named_parameters() if not isinstance(p, DTensor)]
    report["root_unit"] = isinstance(sharded, FSDPModule)
    report["linear_units"] = [isinstance(m, FSDPModule) for m in sharded.modules() if isinstance(m, nn.Linear)]
    report["nested_left"] = [name for name, m in sharded.named_modules() if isinstance(m, nn.Linear)
                             and "." in name and not isinstance(m, FSDPModule)]
    # While the model runs: before each layer's forward, the bytes of the weights that are
    # whole (gathered) on this rank at that moment. FSDP gathers a layer just before its
    # forward and, by default (reshard_after_forward=True), frees it right after.
    whole_in_forward = []

    def before_layer(module, args):
        layers = [m for m in sharded.modules() if isinstance(m, nn.Linear)]
        whole = [i for i, m in enumerate(layers)
                 if any(not isinstance(p, DTensor) for p in m.parameters(recurse=False))]
        nbytes = sum(p.numel() * p.element_size() for i in whole
                     for p in layers[i].parameters(recurse=False))
        whole_in_forward.append((len(whole), nbytes))

    hooks = [m.register_forward_pre_hook(before_layer) for m in sharded.modules()
             if isinstance(m, nn.Linear)]
    report["out"], report["fsdp"] = one_adam_step(sharded)
    for hook in hooks:
        hook.remove()
    report["whole_in_forward"] = max(whole_in_forward, default=(0, 0))
    return harness.plain(report)


# Slips, named only when the answer follows one at the run's point AND at every probe (other
# sizes and world sizes): (where it can happen, answer and reference related, what it means).
SLIPS = (
    (lambda strategy, kind: kind == "optimizer", lambda got, want, world: got * 2 == want,
     "Adam keeps TWO moments per parameter (exp_avg and exp_avg_sq): 2 x 4 bytes each"),
    (lambda strategy, kind: strategy == "ddp", lambda got, want, world: got * world == want,
     "under DDP every rank keeps the WHOLE model: do not divide by the world size"),
    (lambda strategy, kind: strategy == "fsdp", lambda got, want, world: got == want * world,
     "that is what DDP keeps; under FSDP each of the {world} ranks keeps 1/{world}: divide by the world size"),
    (lambda strategy, kind: True, lambda got, want, world: got * 4 == want,
     "you counted values, not bytes: an fp32 value takes 4 bytes (FP32_BYTES)"),
)
PROBES = ((1000, 2), (1200, 3), (4096, 4))


def explain(strategy, kind, predicted, measured, probes, WORLD=WORLD):
    """The learner's likely mistake, from how the prediction relates to the measurement,
    confirmed on the probes (``{"got": the learner's, "want": the reference's}``
    predictions there; kinds are compared in the order params, grads, optimizer: by the
    optimizer, the first two were right)."""
    if predicted == 0:
        return f"you predicted no {kind} at all"
    for applies, related, why in SLIPS:
        if applies(strategy, kind) and _related(related, predicted, measured, WORLD) and \
                _everywhere(related, strategy, kind, probes):
            return why.format(world=WORLD)
    return "params and grads take 4 bytes per parameter each, Adam's state 8, divided by the ranks under FSDP"


def _related(related, got, want, world) -> bool:
    try:
        return bool(related(got, want, world))
    except Exception:  # noqa: BLE001 - a prediction no arithmetic applies to follows no slip
        return False


def _everywhere(related, strategy, kind, probes) -> bool:
    try:
        return all(_related(related, got[kind], want[kind], world) for got, want, (_, world)
                   in zip(probes["got"][strategy], probes["want"][strategy], PROBES, strict=True))
    except Exception:  # noqa: BLE001 - an answer that fails a probe follows no slip
        return False


def merged(got, expected):
    """Each rank's report as the checks below read it: the learner's predictions and
    sharding, with the run's facts and the reference's predictions from the reference's
    run (never from the learner's data), and whether the outputs are the plain model's."""
    import torch

    ranks = []
    for g, e in zip(harness.same_ranks(got, expected), expected):
        g = g if isinstance(g, dict) else {}
        out = g.get("out")
        same = (isinstance(out, torch.Tensor) and out.shape == e["ddp_out"].shape
                and out.dtype == e["ddp_out"].dtype and torch.allclose(out, e["ddp_out"], rtol=0, atol=1e-6))
        ranks.append({**{k: v for k, v in g.items() if k not in e}, **e, "same_output": same,
                      "probes": {"got": g.get("probes"), "want": e["probes"]}})
    return ranks


def judge_layout(ranks, where=""):
    r = ranks[0]
    WORLD, NUM_PARAMS = r["world"], r["num_params"]
    for strategy in ("ddp", "fsdp"):
        predicted = r["predicted"][strategy]
        if not isinstance(predicted, dict) or set(predicted) != set(KINDS):
            raise harness.ExerciseFailure(where +
                f"predict_bytes_per_rank(..., {strategy!r}) returned {predicted!r}: return a dict "
                f"with exactly the keys 'params', 'grads' and 'optimizer' (bytes per rank)")
    if "returned" in r:
        raise harness.ExerciseFailure(where +
            f"shard(model) returned {r['returned']}, not the model: return the model you sharded")
    if r["whole"]:
        raise harness.ExerciseFailure(where +
            f"after shard(model) the parameters {harness.short_list(r['whole'])} are still whole "
            f"(plain tensors, not DTensor shards) on every rank: call fully_shard on every nn.Linear")
    if any(r["linear_units"]) and r.get("nested_left") and \
            sum(not unit for unit in r["linear_units"]) == len(r["nested_left"]):
        raise harness.ExerciseFailure(where +
            f"the nn.Linear layers at the top level of the model are FSDP units, but not the one(s) inside a "
            f"nested block ({harness.short_list(r['nested_left'])}): a walk over model.children() or over the "
            f"model itself sees only the top level. model.modules() visits every module at every depth")
    if not all(r["linear_units"]):
        raise harness.ExerciseFailure(where +
            f"only {sum(r['linear_units'])} of the {len(r['linear_units'])} nn.Linear layers are "
            f"FSDP units of their own: with fully_shard on the root only, the forward gathers the "
            f"WHOLE model at once, which is what sharding should avoid. Call fully_shard on every "
            f"nn.Linear, then on the model")
    if not r["root_unit"]:
        raise harness.ExerciseFailure(where +
            "the model itself is not sharded: after the layers, call fully_shard(model) on the "
            "root too (it runs the hooks that gather and free each layer's weights)")
    layers, nbytes = r["whole_in_forward"]
    if layers > 1:
        raise harness.ExerciseFailure(where +
            f"while the model ran its forward, rank 0 held {layers} layers' whole weights at "
            f"once ({nbytes} bytes; the largest layer alone is {r['largest_layer']}): FSDP "
            f"gathers each layer just before its forward, and with reshard_after_forward=False "
            f"keeps it whole until the backward, so the peak grows to the whole model. Leave "
            f"fully_shard's default (reshard_after_forward=True): one layer whole at a time")
    if not r["same_output"]:
        raise harness.ExerciseFailure(where +
            "the sharded model computes other outputs than the plain one with the same weights: "
            "shard(model) must only shard it, not change or re-create its layers")
    for rank, report in enumerate(ranks):
        for kind in KINDS:  # the learner's sharding against the reference's prediction first
            measured, reference = report["fsdp"][kind], report["reference"]["fsdp"][kind]
            if measured != reference:
                raise harness.ExerciseFailure(where +
                    f"under your shard(model), rank {rank} holds {measured} bytes of {kind} (measured), but FSDP "
                    f"over all {WORLD} ranks leaves each {reference} (1/{WORLD}; {measured / reference:.3g}x that): "
                    f"your sharding shards over fewer ranks than the world. fully_shard's default mesh is every "
                    f"rank of the run; a mesh of one node's processes, or a 2-D mesh (nodes x processes per node: "
                    f"HSDP, which shards within a node and replicates across nodes) keeps more on each rank")
    for rank, report in enumerate(ranks):
        for strategy in ("ddp", "fsdp"):
            for kind in KINDS:
                predicted, measured = report["predicted"][strategy][kind], report[strategy][kind]
                if predicted != measured:
                    raise harness.ExerciseFailure(where +
                        f"under {strategy.upper()} with {WORLD} ranks you predicted {predicted!r} bytes "
                        f"of {kind} per rank; rank {rank} holds {measured} (measured, model of "
                        f"{NUM_PARAMS} parameters): "
                        f"{explain(strategy, kind, predicted, measured, report['probes'], WORLD)}")
    if WORLD != 2:
        return
    four = r["predicted_fsdp_4"]
    expected = {k: v // 2 for k, v in r["fsdp"].items() if k in KINDS}
    if not isinstance(four, dict) or {k: four.get(k) for k in KINDS} != expected:
        raise harness.ExerciseFailure(where +
            f"with 4 ranks under FSDP you predicted {four!r}, but the 2-rank measurement halves "
            f"to {expected}: divide by world_size, not by a fixed number")


def test_predicted_bytes_match_the_measured_ones():
    harness.judge_here(sys.modules[__name__], [TWO], harness.check_seed())


def test_three_processes_and_two_nodes_hold_their_share():
    """3 processes and 2 nodes x 2 (world size 4, 2 per node): a model whose layers divide
    by 3 and 4, measured and predicted as on 2."""
    harness.judge_here(sys.modules[__name__], LAYOUT_PARTS, harness.check_seed())


def test_prediction_matches_the_reference_for_every_world_size():
    """A pure function: compared with the reference's, world sizes 1 to 8 (1: no sharding
    at all), for a number of parameters that divides by all of them."""
    harness.judge_here(sys.modules[__name__], [EVERY_WORLD], harness.check_seed())


PREDICTED_AT = [(world, strategy) for world in range(1, 9) for strategy in ("ddp", "fsdp")]


def predictions(module, learner, params):
    """``module``'s predictions for ``params`` parameters at :data:`PREDICTED_AT`, in
    order; for the learner's, where a call raises, the sentence saying so ends the list."""
    values = []
    for world, strategy in PREDICTED_AT:
        if not learner:
            values.append(module.predict_bytes_per_rank(params, world, strategy))
            continue
        try:
            values.append(harness.plain(module.predict_bytes_per_rank(params, world, strategy)))
        except NotImplementedError as error:
            values.append({"not solved": harness.not_solved_message(error)})
            break
        except Exception as error:  # noqa: BLE001 - the learner's error, reported in its turn
            values.append({"raised": f"predict_bytes_per_rank({params}, {world}, {strategy!r}) "
                                     f"raised {type(error).__name__}: {error}"})
            break
    return values


def judge_predictions(got, expected, params):
    if not isinstance(got, list):
        raise harness.ExerciseFailure(f"the check's data should be a list, got {harness.describe(got)}")
    for (world, strategy), want, value in zip(PREDICTED_AT, expected, got):
        said = value if isinstance(value, dict) and len(value) == 1 else {}
        if isinstance(said.get("not solved"), str):
            raise harness.NotSolved(said["not solved"])
        if isinstance(said.get("raised"), str):
            raise harness.ExerciseFailure(said["raised"])
        differs = harness.difference(want, value, what=f"predict_bytes_per_rank({params}, {world}, "
                                                       f"{strategy!r})")
        if differs:
            raise harness.ExerciseFailure(
                f"{differs} (the reference solution's: {want}; fp32 params and grads 4 bytes per "
                f"parameter each, Adam's two moments 8, all divided by the world size under FSDP "
                f"only" + (", and with 1 process nothing is divided" if world == 1 else "") + ")")
    if len(got) != len(expected):
        raise harness.ExerciseFailure(f"the check's data should hold {len(expected)} predictions, got {len(got)}")


# --- the check's two halves (harness.judge_here; distkit grade judges outside the sandbox) ---

TWO = "2 processes"
LAYOUT_PARTS = (harness.LAYOUTS[2][0], harness.LAYOUTS[3][0])
EVERY_WORLD = "the prediction for world sizes 1 to 8"
PARTS = (TWO, *LAYOUT_PARTS, EVERY_WORLD)


def collect(part, whos, seed):
    """``{who: [what each rank gave]}`` for a layout, ``{who: [predictions]}`` for the last part."""
    if part == EVERY_WORLD:
        params = drawn(seed)[1]
        return {who: predictions(harness.answer("10", who), who == harness.LEARNER, params) for who in whos}
    harness.preload_for("10", whos)
    if part == TWO:
        return harness.by_who(harness.run_ranks(on_rank, whos, drawn(seed)[0]), whos)
    layout = harness.LAYOUTS[2 + LAYOUT_PARTS.index(part)]
    return harness.by_who(harness.run_layouts(on_rank, whos, drawn(seed)[0], layouts=[layout])[part], whos)


def judge(part, got, expected, seed):
    """Raises the learner's :class:`harness.ExerciseFailure` when ``got`` is wrong; its
    numbers are the seed's, which it names."""
    try:
        if part == EVERY_WORLD:
            judge_predictions(got, expected, drawn(seed)[1])
        else:
            judge_layout(merged(got, expected), "" if part == TWO else f"on {part}: ")
    except harness.NotSolved:
        raise
    except harness.ExerciseFailure as failure:
        raise harness.ExerciseFailure(f"{failure} {harness.replay(seed)}") from None
