# %% [markdown]
# # 12 · Tensor and sequence parallel on a transformer block (CPU, gloo)
#
# Notebook 11 split one MLP over 2 ranks. A transformer block has two such parts, the
# attention and the MLP, and two LayerNorms around them. **Tensor parallel** (Megatron-LM,
# Shoeybi et al. 2019) splits both parts over N ranks:
#
# - in the attention, each rank computes **its own heads**: `q`, `k` and `v` are split
#   by output features (*column-wise*), the output projection `proj` by input features
#   (*row-wise*), and one all-reduce adds the partial outputs;
# - in the MLP, the first `Linear` is split column-wise, the second row-wise, with one
#   all-reduce at the end, as in notebook 11.
#
# What tensor parallel leaves whole on every rank are the LayerNorms and the residual
# stream. **Sequence parallel** (Korthikanti et al. 2022) splits those along the
# *sequence*: each rank normalises its own tokens, and each all-reduce becomes a
# reduce-scatter (into sequence shards) and an all-gather (back to the whole sequence
# before the next split layer).
#
# Everything below runs PyTorch's own API on 2 gloo ranks on a CPU:
# `init_device_mesh`, `parallelize_module` with `ColwiseParallel`, `RowwiseParallel`,
# `SequenceParallel` and `PrepareModuleInput`, and torch's collective counter
# `CommDebugMode`. Every sharded result is compared with the same block on one process:
# forward, input gradient and every parameter's gradient. Then: the collectives of each
# layer, against the formulas, and the memory each rank holds.
#
# Hardware: any CPU. Backend: `gloo`. Nothing here is timed: counts and bytes are exact,
# whatever the load on the machine.

# %%
import os

import torch
import torch.distributed as dist

from distkit.lessons.pipeline import ActivationMeter
from distkit.lessons.sharded import CommCounter, format_table
from distkit.lessons.transformer import largest_grad_difference, local_bytes
from distkit.models import Block
from distkit.runner import run_per_rank

cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
print(f"torch {torch.__version__}, {cores} CPU cores")

BATCH, SEQ, DIM, HEADS = 4, 64, 64, 4
TP = 2  # ranks in the tensor-parallel group

torch.manual_seed(0)
print(Block(DIM, HEADS))

# %% [markdown]
# ## 1. The block, and where it is cut
#
# `Block` is the kit's own GPT block (`distkit.models.Block`, the one `distkit train
# --model gpt` stacks), a GPT-2-style pre-norm block:
# `x + attn(ln1(x))`, then `x + mlp(ln2(x))`. Its attention has separate `q`, `k`, `v`
# projections and reshapes with `view(B, T, -1, head_dim)`: after the split a rank
# holds `HEADS / TP` heads, and the module must not assume how many.
#
# The **plan** is a dict from a sub-module's name to how it is split. Two plans:
#
# - **TP**: `q`, `k`, `v` and `mlp.fc` `ColwiseParallel()`; `attn.proj` and `mlp.proj`
#   `RowwiseParallel()`. `PrepareModuleInput` on `attn` and `mlp` turns their (whole)
#   input into a replicated `DTensor` before the three projections read it: then the
#   backward adds the three projections' input gradients first and all-reduces **once**
#   per part (Megatron's *f* operator), not once per projection.
# - **TP + SP**: the same, plus `SequenceParallel()` on both norms (they work on a
#   sequence shard), `PrepareModuleInput(Shard(1) → Replicate())` on `attn` and `mlp`
#   (the all-gather of the sequence) and `RowwiseParallel(output_layouts=Shard(1))` (the
#   reduce-scatter of the output). The block's input and output are then this rank's
#   `SEQ / TP` tokens.

# %%
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)


def plan(sequence_parallel):
    split = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
             "mlp.fc": ColwiseParallel()}
    if not sequence_parallel:
        whole = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),),
                                   use_local_output=False)
        return split | {"attn": whole, "mlp": whole, "attn.proj": RowwiseParallel(), "mlp.proj": RowwiseParallel()}
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return split | {"ln1": SequenceParallel(), "ln2": SequenceParallel(), "attn": gather, "mlp": gather,
                    "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
                    "mlp.proj": RowwiseParallel(output_layouts=Shard(1))}


def inputs():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, SEQ, DIM, generator=g)
    weight = torch.randn(BATCH, SEQ, DIM, generator=g)  # loss = (out * weight).sum(): every output counts
    return x, weight


# %% [markdown]
# ## 2. Split, run, compare with one process
#
# On each rank: the reference block on the whole input (one process's answer, computed
# right there), then the same weights split by `parallelize_module(block, mesh, plan)`,
# run forward and backward inside `CommDebugMode` (torch's counter of the collectives
# DTensor issues, per module), `CommCounter` (the tensors each collective moves) and
# `ActivationMeter` (the bytes autograd saves for the backward). Under SP a rank feeds
# its own `SEQ / TP` tokens and gets its own tokens' output back. Gradients of split
# weights are gathered whole (`DTensor.full_tensor()`) to compare with the reference.
# `run_per_rank` starts the 2 processes with `idist.Parallel(backend="gloo",
# nproc_per_node=2)` and hands back what each returned.

# %%
def split_block(local_rank):
    rank, n = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    x, weight = inputs()
    torch.manual_seed(0)
    reference = Block(DIM, HEADS)
    x_ref = x.clone().requires_grad_()
    with ActivationMeter(reference.parameters()) as kept:
        y_ref = reference(x_ref)
        (y_ref * weight).sum().backward()
    out = {"unsharded": {"kept": kept.peak, "param_bytes": local_bytes(reference)}}
    for name, sp in (("TP", False), ("TP + SP", True)):
        torch.manual_seed(0)
        block = parallelize_module(Block(DIM, HEADS), mesh, plan(sp))
        mine = slice(rank * SEQ // n, (rank + 1) * SEQ // n) if sp else slice(None)  # the tokens this rank feeds
        x_mine = x[:, mine].clone().requires_grad_()
        with ActivationMeter(block.parameters()) as kept, CommDebugMode() as debug, CommCounter() as moved:
            y = block(x_mine)
            (y * weight[:, mine]).sum().backward()
        out[name] = {
            "output": (y - y_ref[:, mine]).abs().max().item(),
            "input grad": (x_mine.grad - x_ref.grad[:, mine]).abs().max().item(),
            "weight grads": max(largest_grad_difference(block, reference).values()),
            "per module": {module: {way: {str(op).split(".")[-1]: c for op, c in ops.items()}
                                    for way, ops in counts.items()}
                           for module, counts in debug.comm_module_counts.items()},
            "moved": moved.log, "kept": kept.peak, "param_bytes": local_bytes(block),
            "shard shapes": {p: tuple(w.to_local().shape) for p, w in block.named_parameters()
                             if p in ("attn.q.weight", "attn.proj.weight", "mlp.fc.weight", "mlp.proj.weight")}}
    return out

# %%
ranks = run_per_rank(split_block, TP, "gloo")
TOL = 1e-5  # float32: the split sums in another order than one matrix product does
for rank, r in enumerate(ranks):
    for name in ("TP", "TP + SP"):
        diffs = {k: r[name][k] for k in ("output", "input grad", "weight grads")}
        print(f"rank {rank} {name:8}: max |split − one process|: "
              + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
        assert all(v <= TOL for v in diffs.values()), (rank, name, diffs)
print("shards on rank 0:", ranks[0]["TP"]["shard shapes"])
assert ranks[0]["TP"]["shard shapes"] == {"attn.q.weight": (DIM // TP, DIM), "attn.proj.weight": (DIM, DIM // TP),
                                          "mlp.fc.weight": (4 * DIM // TP, DIM), "mlp.proj.weight": (DIM, 4 * DIM // TP)}

# %% [markdown]
# Both splits give the one-process block's output, input gradient and every weight's
# gradient to within 1e-5 (asserted for both ranks; the printout gives the measured
# difference, between 1e-7 and 1e-5: the float32 rounding of adding partial sums in
# another order). Under TP + SP that holds for each rank's own tokens, and for the
# LayerNorms' weights too, whose gradient each rank computes from its own tokens only:
# DTensor adds the ranks' parts (the parameter is `Replicate()`, its gradient
# `Partial()` until reduced).
#
# Rank 0 holds the first half of `q`'s output features (heads 0 and 1 of 4) and the
# matching half of `attn.proj`'s input features; likewise `mlp.fc` and `mlp.proj`.
#
# ## 3. Collectives per layer, against the formulas
#
# Let S = BATCH × SEQ × DIM × 4 bytes, one activation of the block in float32
# (4 × 64 × 64 × 4 = 64 KiB). Megatron's accounting, per block and training step:
#
# | | forward | backward |
# | --- | --- | --- |
# | TP | 2 all-reduces of S: after `attn.proj`, after `mlp.proj` | 2 all-reduces of S: the input gradients of `attn` and `mlp` |
# | TP + SP | 2 reduce-scatters of S (after `attn.proj`, `mlp.proj`), 2 all-gathers to S (inputs of `attn`, `mlp`) | the same, swapped: each all-gather's backward is a reduce-scatter and the reverse |
#
# With ring algorithms on N ranks, an all-reduce of S puts 2(N−1)/N · S on each rank's
# wire; a reduce-scatter or an all-gather (N−1)/N · S. So SP moves **the same bytes**
# as TP, in twice as many, half-size steps. `CommDebugMode.comm_module_counts` says
# which module issued each collective:

# %%
def op_counts(ops):
    return ", ".join(f"{op} ×{c}" for op, c in sorted(ops.items())) or "–"


rows = []
for name in ("TP", "TP + SP"):
    for module in ("Block.attn", "Block.mlp", "Block"):
        counts = ranks[0][name]["per module"][module]
        rows.append({"plan": name, "module": module, "forward": op_counts(counts["forward"]),
                     "backward": op_counts(counts["backward"])})
print(format_table(rows, list(rows[0])))

for r in ranks:
    for part in ("Block.attn", "Block.mlp"):  # one collective per part and pass ...
        assert r["TP"]["per module"][part] == {"forward": {"all_reduce": 1}, "backward": {"all_reduce": 1}}
        assert r["TP + SP"]["per module"][part] == {
            "forward": {"all_gather_into_tensor": 1, "reduce_scatter_tensor": 1},
            "backward": {"all_gather_into_tensor": 1, "reduce_scatter_tensor": 1}}

# %% [markdown]
# Now the sizes: `CommCounter` logged the shape of each collective's tensor. An
# all-reduce's is the whole activation (B, T, D); a reduce-scatter's input is the whole
# activation laid out as TP pieces stacked on dim 0, (TP·B, T/TP, D); an all-gather's
# input is one rank's piece (B, T/TP, D), its output TP times that.

# %%
S = BATCH * SEQ * DIM * 4
ring = {"all_reduce": 2 * (TP - 1) / TP, "all_gather": (TP - 1) / TP, "reduce_scatter": (TP - 1) / TP}
for name in ("TP", "TP + SP"):
    moved = ranks[0][name]["moved"]
    whole = {k: 0 for k in ring}
    for kind, shape, _ in moved:
        values = torch.Size(shape).numel() * (TP if kind == "all_gather" else 1)  # the gathered output
        whole[kind] += 4 * values
    on_wire = sum(ring[k] * b for k, b in whole.items())
    print(f"{name:8}: {len(moved)} collectives {sorted({(k, s) for k, s, _ in moved})}; "
          f"whole tensors {whole}; sent per rank {on_wire / 1024:.0f} KiB = {on_wire / S:.1f} S")
    if name == "TP":
        assert [(k, s) for k, s, _ in moved] == [("all_reduce", (BATCH, SEQ, DIM))] * 4
        assert on_wire == 4 * 2 * (TP - 1) / TP * S
    else:
        assert sorted((k, s) for k, s, _ in moved) == [("all_gather", (BATCH, SEQ // TP, DIM))] * 4 + [
            ("reduce_scatter", (TP * BATCH, SEQ // TP, DIM))] * 4
        assert on_wire == 8 * (TP - 1) / TP * S
sp_wire = 8 * (TP - 1) / TP * S
assert sp_wire == 4 * 2 * (TP - 1) / TP * S  # the same bytes, as the formulas say

# %% [markdown]
# Measured and asserted: TP issues 4 all-reduces of a whole (4, 64, 64) activation per
# block and step; TP + SP 4 all-gathers and 4 reduce-scatters of the same size, and each
# rank sends the same 4 · 2(N−1)/N · S = 4 S = 256 KiB under both. This traffic grows
# with the **activations** (batch × sequence × width), once per block and pass, on the
# critical path: nothing else can run while a layer waits for its sum. That is why
# tensor parallel stays inside a node, on the fastest links (NVLink), and why N is
# rarely above 8.
#
# ## 4. Memory per rank
#
# **Parameters.** The four attention projections hold 4·D² weights and the MLP 8·D²;
# TP halves all of them, and the biases of the column-split layers; the row-split
# layers' biases (added once, after the sum) and the norms stay whole on every rank.
#
# **Activations** saved for the backward (`ActivationMeter`): TP halves what lives
# *inside* attention and MLP (the heads' q, k, v and outputs, the 4·D hidden), but each
# LayerNorm keeps its whole input (B, T, D) and its per-token mean and 1/std (B, T)
# on every rank. SP keeps only this rank's T/N tokens of those:
# 2 norms × (B·T·D + 2·B·T) × 4 bytes × (1 − 1/N) less.

# %%
D = DIM
whole_params = sum(p.numel() for p in Block(DIM, HEADS).parameters())
split_weights = 4 * D * D + 2 * 4 * D * D          # q, k, v, proj; fc, proj
split_biases = 3 * D + 4 * D                        # q, k, v; fc (column-split)
whole_parts = 2 * D + 2 * 2 * D                     # the two proj biases; 2 norms' weight and bias
assert split_weights + split_biases + whole_parts == whole_params
predicted_params = 4 * ((split_weights + split_biases) // TP + whole_parts)
norm_saves = 2 * (BATCH * SEQ * DIM + 2 * BATCH * SEQ) * 4

table = []
for name in ("unsharded", "TP", "TP + SP"):
    r = ranks[0][name]
    table.append({"rank 0": name, "parameters": f"{r['param_bytes'] / 1024:.1f} KiB",
                  "activations saved for backward": f"{r['kept'] / 1024:.0f} KiB",
                  "share of unsharded": f"{r['kept'] / ranks[0]['unsharded']['kept']:.2f}"})
print(format_table(table, list(table[0])))
print(f"predicted parameters under TP: {predicted_params / 1024:.1f} KiB; "
      f"the norms' saved tensors: {norm_saves / 1024:.0f} KiB whole, SP saves {norm_saves * (TP - 1) / TP / 1024:.0f} KiB")

for r in ranks:
    assert r["unsharded"]["param_bytes"] == 4 * whole_params
    assert r["TP"]["param_bytes"] == r["TP + SP"]["param_bytes"] == predicted_params
    assert r["TP"]["kept"] < r["unsharded"]["kept"]
    assert r["TP"]["kept"] <= 0.7 * r["unsharded"]["kept"]
    assert r["TP"]["kept"] - r["TP + SP"]["kept"] == norm_saves * (TP - 1) // TP

# %% [markdown]
# What the table and the assertions say, on each rank:
#
# - **Parameters**: TP holds (12·D² + 7·D)/N + 6·D values instead of 12·D² + 13·D,
#   bytes exactly as predicted (asserted): close to half, the norms and two biases
#   whole. SP changes no parameter.
# - **Activations**: TP keeps at most 70% of the unsharded block's (asserted; the table
#   gives the measured share): the inside of attention and MLP is split. SP then saves exactly the norms'
#   share, 2 × (B·T·D + 2·B·T) × 4 × (N−1)/N bytes (asserted to the byte). What is still
#   whole under TP + SP is the all-gathered input that `q`, `k`, `v` and `mlp.fc` keep
#   for their weight gradients (Megatron-LM re-gathers it in the backward instead, one
#   more all-gather to save that memory).
#
# The bytes on the wire are the same for TP and TP + SP (section 3), so sequence
# parallel is a free saving of activation memory, which is why it is used wherever
# tensor parallel is. What neither splits is the **attention over a long sequence**:
# every rank still computes its heads over all T tokens. Splitting that is context
# parallel, notebook 13.
