"""Checks for exercise 14: the learner's FLOPs of a training step against the reference
solution's count, EXACTLY, on fixed and seeded random GPT shapes and world sizes (1
included); the reference's count against the FLOPs torch itself executes in that step
(``FlopCounterMode``, one process, the whole run's batch); and their MFU against the
reference's on random values and on a real timed step against a measured matmul peak. A
wrong count is matched against the usual mistakes (exactly) to name the one made;
otherwise the message says which term differs."""
import math
import statistics
import time

import pytest
import torch

import harness

pytestmark = pytest.mark.ex14

VOCAB = 50
# (layers, heads, d_model, block size T, batch per rank, world size): two shapes, so that a
# count fitted to one of them fails on the other
SHAPES = [(2, 4, 64, 64, 4, 2), (3, 2, 64, 32, 3, 4)]
TOLERANCE = 0.025
"""How far the REFERENCE's 6N + 12LTd count may be from torch's: it leaves out what
FlopCounterMode adds (the flash-attention backward recomputes Q K^T: +0.8% here) and counts
the biases and LayerNorm weights as if they were multiplied like weights (-1.8% at most
here). The learner's count is compared with the reference's exactly: a whole extra or
missing term (one bias, one layer's attention) is far below 2.5% and must not pass."""


def random_shapes(seed, count=3):
    """Seeded random shapes (replayable): odd sizes, world size 1 included."""
    import random

    rng = random.Random(seed)
    shapes = []
    for i in range(count):
        heads = rng.choice([1, 2, 3])
        shapes.append((rng.randint(1, 3), heads, heads * rng.choice([8, 12, 16]), rng.choice([7, 16, 24]),
                       rng.randint(1, 5), 1 if i == 0 else rng.choice([2, 3, 5, 8])))
    return shapes


def gpt(layers, heads, d, T):
    from distkit.models import GPT

    torch.manual_seed(0)
    return GPT(VOCAB, T, n_layer=layers, n_head=heads, d_model=d)


def batch(n, T):
    g = torch.Generator().manual_seed(14)
    return torch.randint(0, VOCAB, (n, T), generator=g), torch.randint(0, VOCAB, (n, T), generator=g)


def train_step(model, x, y):
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    return loss


def counted_flops(layers, heads, d, T, sequences) -> int:
    """What torch executes in one forward + backward of ``sequences`` sequences, in one
    process: the reference the learner's count is checked against."""
    from torch.utils.flop_counter import FlopCounterMode

    model = gpt(layers, heads, d, T)
    with FlopCounterMode(display=False) as counter:
        train_step(model, *batch(sequences, T))
    return counter.get_total_flops()


def mistakes(model, batch_per_rank, world_size) -> list:
    """(what the learner did, the count it gives): the usual slips."""
    L, d, T = model.n_layer, model.d_model, model.block_size
    n = sum(p.numel() for name, p in model.named_parameters() if "emb" not in name)
    tables = sum(p.numel() for name, p in model.named_parameters() if "emb" in name)
    attn = 12 * L * T * d
    tokens = batch_per_rank * world_size * T
    return [
        ("you counted the forward pass only (2 FLOPs per weight and token, and attention's "
         "forward): the backward computes two products per weight matrix, the input's gradient "
         "and the weight's, twice the forward: 6 N per token in all, and 3x attention's forward",
         (2 * n + attn / 3) * tokens),
        ("you left out attention's own products, Q K^T and A V, which multiply activations and "
         "have no weights: 2·T·d FLOPs each per token and layer forward, x3 with the backward: "
         "12·L·T·d per token", 6 * n * tokens),
        ("you counted half of attention's products, as if the causal mask saved the upper "
         "triangle; the T x T products are computed in full: 12·L·T·d per token",
         (6 * n + attn / 2) * tokens),
        ("you counted the embedding tables (tok_emb, pos_emb) in N: a lookup does no "
         "arithmetic; leave them out of N", (6 * (n + tables) + attn) * tokens),
        (f"that is ONE process's step: all {world_size} processes train batch_per_rank "
         f"sequences each, so the run's step has batch_per_rank x world_size sequences",
         (6 * n + attn) * batch_per_rank * T),
        ("you counted sequences, not tokens: every sequence has block_size tokens, and the "
         "FLOPs per token apply to each of them", (6 * n + attn) * batch_per_rank * world_size),
    ]


def explain_count(got, want, model, per_rank, world) -> str:
    """What differs between two counts, in the terms of the formula."""
    L, d, T = model.n_layer, model.d_model, model.block_size
    tokens = per_rank * world * T
    n = sum(p.numel() for name, p in model.named_parameters() if "emb" not in name)
    per_token = (got - want) / tokens
    parts = [f"per token of the step's {tokens} tokens yours is {per_token:+.6g} FLOPs off the reference's "
             f"6 N + 12 L T d = 6 x {n} + 12 x {L} x {T} x {d}"]
    if per_token == int(per_token) and per_token % 6 == 0 and per_token != 0:
        parts.append(f"that is 6 x {int(per_token // 6):+d} parameters: N should count {n}")
    return "; ".join(parts)


def test_step_flops_equal_the_reference_count_exactly():
    ex, ref = harness.load("14"), harness.load_reference("14")
    seed = harness.check_seed()
    for layers, heads, d, T, per_rank, world in SHAPES + random_shapes(seed):
        model = gpt(layers, heads, d, T)
        got = ex.step_flops(model, per_rank, world)
        shape = f"(n_layer {layers}, d_model {d}, block_size {T}, {per_rank} sequences on each of {world} process(es))"
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            raise harness.ExerciseFailure(
                f"step_flops returned {harness.describe(got)} for the GPT {shape}: return a number (an int or a "
                f"float) of FLOPs")
        want = ref.step_flops(model, per_rank, world)
        if (layers, heads, d, T, per_rank, world) in SHAPES:
            # the count to reach is torch's own, within what the formula leaves out
            counted = counted_flops(layers, heads, d, T, per_rank * world)
            assert abs(want / counted - 1) <= TOLERANCE, f"check bug: reference {want} vs torch's {counted}"
        if math.isclose(got, want, rel_tol=1e-12):
            continue
        for slip, value in mistakes(model, per_rank, world):
            if math.isclose(got, value, rel_tol=1e-9):
                raise harness.ExerciseFailure(
                    f"step_flops gave {got:.6g} FLOPs for a step of the GPT {shape}; the count is "
                    f"{want:.6g} (yours is {got / want:.3f}x that): {slip}")
        raise harness.ExerciseFailure(
            f"step_flops gave {got:.10g} FLOPs for a step of the GPT {shape}; the reference count is {want:.10g} "
            f"({explain_count(got, want, model, per_rank, world)}) {harness.replay(seed)}")


def timed_step_ms(layers, heads, d, T, sequences) -> float:
    model = gpt(layers, heads, d, T)
    x, y = batch(sequences, T)
    train_step(model, x, y)  # warm-up
    times = []
    for _ in range(3):
        start = time.perf_counter()
        train_step(model, x, y)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def test_mfu_equals_the_reference():
    import random

    from distkit.throughput import matmul_flops_per_second

    ex, ref = harness.load("14"), harness.load_reference("14")
    seed = harness.check_seed()
    rng = random.Random(seed)
    cases = [(6e12, 500.0, 2e13)] + [(rng.uniform(1e9, 1e15), rng.uniform(0.5, 5000.0), rng.uniform(1e11, 1e16))
                                     for _ in range(3)]
    for index, (flops, ms, peak) in enumerate(cases):
        if index == 1:  # once the plain cases pass: a real step, timed, against a measured peak
            layers, heads, d, T, per_rank, world = SHAPES[0]
            flops = float(counted_flops(layers, heads, d, T, per_rank * world))
            ms = timed_step_ms(layers, heads, d, T, per_rank * world)
            peak = matmul_flops_per_second(n=512, seconds=0.2, device="cpu")
        got, want = ex.mfu(flops, ms, peak), ref.mfu(flops, ms, peak)
        case = f"mfu({flops:.6g} FLOPs a step, a step every {ms:.6g} ms, peak {peak:.6g} FLOP/s)"
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            raise harness.ExerciseFailure(
                f"{case} returned {harness.describe(got)}: return a number, the fraction of the peak")
        if math.isclose(got, want, rel_tol=1e-9):
            continue
        if math.isclose(got, want / 1000, rel_tol=1e-6):
            why = ("1000x too small: step_time_ms is in MILLIseconds and the peak in FLOP per SECOND; "
                   "divide the FLOPs by step_time_ms / 1000")
        elif math.isclose(got, want * 1000, rel_tol=1e-6):
            why = "1000x too large: a step of step_time_ms milliseconds lasts step_time_ms / 1000 seconds"
        elif math.isclose(got, want * 100, rel_tol=1e-6):
            why = "that is a percentage; return the fraction (0.25, not 25)"
        elif math.isclose(got, 1 / want, rel_tol=1e-6):
            why = "upside down: the achieved FLOP/s go on top, the peak below"
        else:
            why = ("the FLOPs of a step divided by its time in seconds is the achieved FLOP/s; divide that by the "
                   "peak (the whole run's: flops_per_step counts every process's work)")
        raise harness.ExerciseFailure(f"{case} returned {got:.10g}, not {want:.10g}: {why} {harness.replay(seed)}")
