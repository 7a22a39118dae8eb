"""Checks for exercise 14: the learner's FLOPs of a training step against the FLOPs torch
itself executes in that step (``FlopCounterMode``, one process, the whole run's batch),
and their MFU of a real timed step against a measured matmul peak. A wrong count is
matched against the usual mistakes to name the one made."""
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
"""The 6N + 12LTd count leaves out what FlopCounterMode adds (the flash-attention backward
recomputes Q K^T: +0.8% here) and counts the biases and LayerNorm weights as if they were
multiplied like weights (-1.8% at most here): within 2.5% of torch's count is right."""


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


def test_step_flops_against_torchs_own_count():
    ex = harness.load("14")
    for layers, heads, d, T, per_rank, world in SHAPES:
        model = gpt(layers, heads, d, T)
        got = ex.step_flops(model, per_rank, world)
        shape = f"(n_layer {layers}, d_model {d}, block_size {T}, {per_rank} sequences on each of {world} processes)"
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            raise harness.ExerciseFailure(
                f"step_flops returned {got!r}: return a number (an int or a float) of FLOPs")
        want = counted_flops(layers, heads, d, T, per_rank * world)
        if abs(got / want - 1) <= TOLERANCE:
            continue
        for slip, value in mistakes(model, per_rank, world):
            if math.isclose(got, value, rel_tol=0.01):
                raise harness.ExerciseFailure(
                    f"step_flops gave {got:.4g} FLOPs for a step of the GPT {shape}; torch counts "
                    f"{want:.4g} (yours is {got / want:.2f}x that): {slip}")
        raise harness.ExerciseFailure(
            f"step_flops gave {got:.4g} FLOPs for a step of the GPT {shape}; torch counts "
            f"{want:.4g} (yours is {got / want:.2f}x that, more than {TOLERANCE:.1%} off): per token, "
            f"6 N for the weights plus attention's products; times every token of every process")


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


def test_mfu_of_a_timed_step():
    from distkit.throughput import matmul_flops_per_second

    ex = harness.load("14")
    got = ex.mfu(6e12, 500.0, 2e13)
    if isinstance(got, (int, float)) and math.isclose(got, 0.6, rel_tol=1e-9):
        layers, heads, d, T, per_rank, world = SHAPES[0]
        flops = counted_flops(layers, heads, d, T, per_rank * world)
        ms = timed_step_ms(layers, heads, d, T, per_rank * world)
        peak = matmul_flops_per_second(n=512, seconds=0.2, device="cpu")
        got, want = ex.mfu(flops, ms, peak), flops / (ms / 1000) / peak
        case = f"mfu({flops:.4g} FLOPs, {ms:.1f} ms, peak {peak:.3g} FLOP/s)"
    else:
        want, case = 0.6, "mfu(6e12 FLOPs a step, a step every 500 ms, peak 2e13 FLOP/s)"
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        raise harness.ExerciseFailure(f"{case} returned {got!r}: return a number, the fraction of the peak")
    if math.isclose(got, want, rel_tol=1e-6):
        return
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
        why = "the FLOPs of a step divided by its time in seconds is the achieved FLOP/s; divide that by the peak"
    raise harness.ExerciseFailure(f"{case} returned {got:.6g}, not {want:.6g}: {why}")
