# %% [markdown]
# # 14 · Putting it together: the GPT on a 2 × 2 mesh (CPU, gloo)
#
# Notebooks 10–13 took the ways of splitting a model one at a time. Large runs combine
# them: a `DeviceMesh` with one dimension per way, each process at one coordinate of it.
# Here the kit's own character GPT (`distkit.models.GPT`, the model of `distkit train
# --dataset text --model gpt`, smaller) trains on text from Python's own documentation on
# **4 processes arranged as a 2 × 2 mesh**, twice:
#
# - **data × tensor**: two copies of the model, each split over two ranks by
#   `parallelize_module` (heads and MLP column- then row-wise, as in notebook 12);
# - **data × pipeline**: two copies, each cut into two pipeline stages
#   (`PipelineStage` and `ScheduleGPipe`, as in notebook 11).
#
# Each is trained by an ignite `Engine` whose step is written out, and its loss curve is
# compared with the same training on one process. The notebook ends with a table of what
# every strategy costs (memory, communication, step time), measured here on the same
# model and batches, and when to pick which.
#
# Hardware: any CPU. Backend: `gloo`. 4 processes share this machine's cores, so step
# times are the machine's, not the method's; counts and bytes are exact.

# %%
import os
import statistics
import time

import ignite.distributed as idist
import torch
import torch.distributed as dist
from ignite.engine import Engine, Events

from distkit.data import text_datasets, text_vocab
from distkit.lessons.pipeline import ActivationMeter
from distkit.lessons.sharded import CommCounter, format_table, state_bytes
from distkit.models import GPT
from distkit.runner import run_per_rank
from distkit.text import TokenCrossEntropy

cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
print(f"torch {torch.__version__}, {cores} CPU cores")

SEQ, LAYERS, HEADS, DIM = 64, 2, 4, 64
GLOBAL_BATCH, STEPS, LR = 8, 8, 3e-3
train_set, _ = text_datasets(block_size=SEQ)
VOCAB = len(text_vocab())
# The same batches, in the same order, for every run: blocks 0-7, 8-15, ...
BATCHES = [tuple(torch.stack(t) for t in zip(*(train_set[i] for i in range(s * GLOBAL_BATCH, (s + 1) * GLOBAL_BATCH))))
           for s in range(STEPS)]


def make_gpt():
    torch.manual_seed(0)  # every rank builds the same weights
    return GPT(VOCAB, SEQ, n_layer=LAYERS, n_head=HEADS, d_model=DIM)


PSI = sum(p.numel() for p in make_gpt().parameters())
print(f"GPT: {LAYERS} layers, {HEADS} heads, d_model {DIM}, context {SEQ}, vocabulary {VOCAB}: "
      f"Ψ = {PSI:,} parameters; {STEPS} steps of {GLOBAL_BATCH} × {SEQ} characters")

# %% [markdown]
# ## 1. The training loop every run shares
#
# `train` runs `STEPS` steps of a `step(batch) -> loss` function with an ignite `Engine`
# and records, on every rank: the loss of each step (the global batch's), the time of
# each step, the communication of the whole run (`CommCounter` sees every collective and
# send the process issues) and the bytes of state the rank holds at the end
# (`state_bytes`: parameters, gradients and AdamW's two moments; a sharded parameter
# counts its local shard only).

# %%
def train(step, model, optimizer):
    engine = Engine(lambda engine, batch: step(batch))
    losses, times = [], []

    @engine.on(Events.ITERATION_STARTED)
    def start_clock(engine):
        engine.state.t0 = time.perf_counter()

    @engine.on(Events.ITERATION_COMPLETED)
    def record(engine):
        times.append(time.perf_counter() - engine.state.t0)
        losses.append(engine.state.output)

    with CommCounter() as comm, ActivationMeter(model.parameters()) as kept:
        engine.run(BATCHES, max_epochs=1)
    return {"losses": losses, "step_s": statistics.median(times[1:]),  # the first step warms up
            "comm_calls": {k: v / STEPS for k, v in comm.calls.items()},
            "comm_bytes": comm.total() / STEPS, "state": state_bytes(model, optimizer)["total"],
            "activations": kept.peak}


criterion = TokenCrossEntropy()  # cross entropy over (B*T, vocabulary)

# %% [markdown]
# ## 2. The reference: one process
#
# The plain loop, on the whole batch: what every distributed run below must reproduce.

# %%
def one_process(local_rank):
    model = make_gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)

    def step(batch):
        x, y = batch
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()

    return train(step, model, optimizer)


reference = run_per_rank(one_process, 1, "gloo")[0]
print("one process, loss per step:", " ".join(f"{v:.4f}" for v in reference["losses"]))

# %% [markdown]
# ## 3. A 2 × 2 mesh: data × tensor
#
# `init_device_mesh("cpu", (2, 2), mesh_dim_names=("data", "tensor"))` lays the 4 ranks
# out as a 2 × 2 grid, row-major: ranks 0 and 1 form one model copy (a row), split over
# the `"tensor"` dimension; ranks 0 and 2 hold the same shard of the two copies (a column)
# and average their gradients over the `"data"` dimension. `mesh["tensor"]` and
# `mesh["data"]` are the 1-D sub-meshes each rank belongs to, with their own process
# groups.
#
# The plan is notebook 12's, applied to every block: `q`, `k`, `v` and `mlp.fc`
# column-wise, `attn.proj` and `mlp.proj` row-wise. The embeddings, LayerNorms and head
# stay whole on both ranks of a copy (they see the same input, so they compute the same
# gradients). Data parallel is written out, as DDP does it in buckets: after the
# backward, each gradient (each rank's local shard of it) is all-reduced over the data
# group and divided by its size. The data are sharded over the **data** dimension only:
# both ranks of a copy must see the same half of the batch (`auto_dataloader` would
# shard over all 4 ranks, so the step takes its half of the global batch itself).

# %%
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

TENSOR_PLAN = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
               "attn.proj": RowwiseParallel(), "mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel()}


def average_gradients(model, group):
    """Data parallel, written out: every gradient averaged over the data group."""
    size = dist.get_world_size(group)
    if size == 1:  # a data dimension of 1 (tensor or pipeline parallel alone): nothing to average
        return
    for p in model.parameters():
        grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad  # a DTensor: its shard
        dist.all_reduce(grad, group=group)
        grad /= size

# %%
def data_tensor(local_rank, shape=(2, 2)):
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("data", "tensor"))
    data, mine = mesh["data"].get_group(), mesh["data"].get_local_rank()
    model = make_gpt()
    for block in model.blocks.values():
        parallelize_module(block, mesh["tensor"], TENSOR_PLAN)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)

    def step(batch):
        x, y = (t.chunk(shape[0])[mine] for t in batch)  # this copy's share of the batch
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        average_gradients(model, data)
        optimizer.step()
        loss = loss.detach()
        dist.all_reduce(loss, group=data)
        return loss.item() / shape[0]  # the global batch's loss

    out = train(step, model, optimizer)
    out["coordinate"] = (mine, mesh["tensor"].get_local_rank())
    out["q shard"] = tuple(model.blocks["0"].attn.q.weight.to_local().shape)
    return out


dp_tp = run_per_rank(data_tensor, 4, "gloo")
for rank, r in enumerate(dp_tp):
    print(f"rank {rank}: (data, tensor) = {r['coordinate']}, q weight shard {r['q shard']}")
assert [r["coordinate"] for r in dp_tp] == [(0, 0), (0, 1), (1, 0), (1, 1)]
assert all(r["q shard"] == (DIM // 2, DIM) for r in dp_tp)

# %% [markdown]
# ## 4. A 2 × 2 mesh: data × pipeline
#
# The same grid, with `"pipeline"` as the second dimension: ranks 0 and 1 are the two
# stages of one copy, ranks 2 and 3 of the other. A stage is the GPT with the other
# stage's parts deleted (the model skips a part that is `None`): stage 0 keeps the
# embeddings and block 0, stage 1 block 1, the final LayerNorm and the head.
# `PipelineStage(..., group=mesh["pipeline"].get_group())` sends only within its copy;
# `ScheduleGPipe` cuts each copy's half-batch into 2 micro-batches and computes the loss
# on the last stage, averaging the micro-batches' gradients (`scale_grads=True`, its
# default). Then each stage averages its gradients with the same stage of the other copy.

# %%
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe


def pipeline_stage(model, index):
    if index == 0:
        del model.blocks["1"]
        model.ln_f = model.head = None
    else:
        del model.blocks["0"]
        model.tok_emb = model.pos_emb = None
    return model

# %%
def data_pipeline(local_rank, shape=(2, 2)):
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("data", "pipeline"))
    data, mine = mesh["data"].get_group(), mesh["data"].get_local_rank()
    index = mesh["pipeline"].get_local_rank()
    model = pipeline_stage(make_gpt(), index)
    stage = PipelineStage(model, index, 2, torch.device("cpu"), group=mesh["pipeline"].get_group())
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=criterion)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)

    def step(batch):
        x, y = (t.chunk(shape[0])[mine] for t in batch)
        optimizer.zero_grad()
        if index == 0:
            schedule.step(x)
            loss = None
        else:
            losses = []
            schedule.step(target=y, losses=losses)
            loss = torch.stack(losses).mean().detach()
            dist.all_reduce(loss, group=data)  # the last stages of both copies
            loss = loss.item() / shape[0]
        average_gradients(model, data)
        optimizer.step()
        return loss

    out = train(step, model, optimizer)
    out["coordinate"] = (mine, index)
    out["blocks"] = list(model.blocks)
    return out


dp_pp = run_per_rank(data_pipeline, 4, "gloo")
for rank, r in enumerate(dp_pp):
    print(f"rank {rank}: (data, pipeline) = {r['coordinate']}, blocks {r['blocks']}")
assert [r["blocks"] for r in dp_pp] == [["0"], ["1"], ["0"], ["1"]]

# %% [markdown]
# ## 5. The loss curves, against one process
#
# Every run trained the same weights on the same batches; only the arithmetic's order
# differs (a split product adds partial sums, micro-batches are averaged, gradients are
# all-reduced), so the curves may differ in the last bits of float32 and no more.

# %%
import matplotlib.pyplot as plt

curves = {"one process": reference["losses"], "data × tensor (rank 0)": dp_tp[0]["losses"],
          "data × pipeline (rank 1, a last stage)": dp_pp[1]["losses"]}
fig, ax = plt.subplots(figsize=(6, 3.5))
for (name, losses), style in zip(curves.items(), ("k-", "o:", "x--")):
    ax.plot(range(1, STEPS + 1), losses, style, label=name)
ax.set(xlabel="step", ylabel="training loss (nats per character)")
ax.legend(fontsize=8)
plt.show()

LOSS_TOL = 1e-5  # float32 sums in another order, compounded over the steps by AdamW
for name, ranks in (("data × tensor", dp_tp), ("data × pipeline", [dp_pp[1], dp_pp[3]])):
    for r in ranks:
        diff = max(abs(a - b) for a, b in zip(r["losses"], reference["losses"]))
        print(f"{name}, rank at {r['coordinate']}: max |loss − one process's| over {STEPS} steps = {diff:.1e}")
        assert diff <= LOSS_TOL, (name, diff)
assert reference["losses"][-1] < reference["losses"][0] - 0.5  # and it learns

# %% [markdown]
# Both 2 × 2 meshes train the one-process curve: every step's loss within 1e-5 of it,
# on every rank that computes the loss (asserted; the printout gives the measured
# difference). The loss falls by more than half a nat in 8 steps (asserted), so the
# curves compared are a model learning, not a constant.
#
# ## 6. Every strategy, on the same model and batches
#
# For the table, the same training with every strategy of notebooks 10–13 on 2
# processes, and the two meshes above on 4. Sequence and context parallel (notebooks 12
# and 13) split the *activations* along the sequence; here they train the whole GPT,
# and their loss curves are checked against one process like the others.
#
# - DDP: `idist.auto_model` (DistributedDataParallel), each rank half the batch;
# - FSDP: `fully_shard` on every block, then on the model (notebook 10);
# - tensor and pipeline parallel alone: the functions above on a 1 × 2 mesh (a data
#   dimension of size 1).

# %%
from torch.distributed.fsdp import fully_shard


def data_parallel(local_rank, strategy):
    model = make_gpt()
    if strategy == "DDP":
        model = idist.auto_model(model)
    else:
        for block in model.blocks.values():
            fully_shard(block)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    rank, n = dist.get_rank(), dist.get_world_size()

    def step(batch):
        x, y = (t.chunk(n)[rank] for t in batch)
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces the gradients; FSDP reduce-scatters them
        optimizer.step()
        return idist.all_reduce(loss.item()) / n

    return train(step, model, optimizer)

# %% [markdown]
# - TP + SP: notebook 12's plan (norms `SequenceParallel`, the attention's and MLP's
#   inputs all-gathered, their outputs reduce-scattered), plus the two ends of the
#   sequence-parallel region, on the whole model: block 0 takes its rank's half of the
#   tokens of the embeddings' output, and `ln_f` all-gathers them back for the head.

# %%
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import PrepareModuleInput, SequenceParallel

GATHER = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
SEQUENCE_PLAN = TENSOR_PLAN | {"ln1": SequenceParallel(), "ln2": SequenceParallel(), "attn": GATHER, "mlp": GATHER,
                               "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
                               "mlp.proj": RowwiseParallel(output_layouts=Shard(1))}
ENDS = {"blocks.0": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                       use_local_output=True),
        "ln_f": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                   use_local_output=True)}


def sequence_parallel(local_rank):
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = make_gpt()
    for block in model.blocks.values():
        parallelize_module(block, mesh, SEQUENCE_PLAN)
    parallelize_module(model, mesh, ENDS)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)

    def step(batch):
        x, y = batch  # every rank the whole batch; the blocks see their rank's tokens only
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()

    return train(step, model, optimizer)

# %% [markdown]
# - CP: every layer on the rank's own positions, notebook 13's zig-zag split (rank r
#   keeps chunks r and 2N − 1 − r of 2N); the attention's keys and values are
#   all-gathered from every rank (the rotation torch's own `context_parallel` uses by
#   default; notebook 13's ring passes the same blocks point to point, forward only).
#   As a `DTensor` sharded on the sequence, `full_tensor()` is that all-gather, and
#   `grad_placements=[Partial()]` says what its gradient is: each rank's queries add
#   their part to every key's gradient, so the backward reduce-scatters the parts back
#   to the rank that holds the key. The weights see only their rank's tokens, so their
#   gradients are averaged as data parallel's are.

# %%
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Partial


def zigzag(rank, n, seq):
    size = seq // (2 * n)
    return torch.cat([torch.arange(rank * size, (rank + 1) * size),
                      torch.arange((2 * n - 1 - rank) * size, (2 * n - rank) * size)])


class ContextParallelAttention(torch.nn.Module):
    """A block's attention (its own q, k, v, proj) for the queries at positions ``mine``,
    against the keys and values of every rank, gathered in rank order (``order``)."""

    def __init__(self, attn, mesh, mine, order):
        super().__init__()
        self.attn, self.mesh, self.mine, self.order = attn, mesh, mine, order

    def gather(self, t):  # (B, T/N, D) on each rank -> (B, T, D); backward: reduce-scatter
        return DTensor.from_local(t, self.mesh, [Shard(1)]).full_tensor(grad_placements=[Partial()])

    def forward(self, x):
        a, (B, T, _) = self.attn, x.shape

        def heads(t):
            return t.view(B, t.shape[1], -1, a.head_dim).transpose(1, 2)

        k, v = self.gather(a.k(x)), self.gather(a.v(x))
        causal = self.order[None, :] <= self.mine[:, None]  # key position ≤ query position
        y = F.scaled_dot_product_attention(heads(a.q(x)), heads(k), heads(v), attn_mask=causal)
        return a.proj(y.transpose(1, 2).reshape(B, T, -1))

# %%
def context_parallel(local_rank):
    rank, n = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    mine = zigzag(rank, n, SEQ)
    order = torch.cat([zigzag(r, n, SEQ) for r in range(n)])
    model = make_gpt()
    for block in model.blocks.values():
        block.attn = ContextParallelAttention(block.attn, mesh, mine, order)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)

    def forward(x):  # the GPT's forward, on this rank's positions
        h = model.tok_emb(x) + model.pos_emb(mine)
        for block in model.blocks.values():
            h = block(h)
        return model.head(model.ln_f(h))

    def step(batch):
        x, y = (t[:, mine] for t in batch)
        loss = criterion(forward(x), y)  # the mean over this rank's tokens
        optimizer.zero_grad()
        loss.backward()
        average_gradients(model, dist.group.WORLD)
        optimizer.step()
        return idist.all_reduce(loss.item()) / n

    return train(step, model, optimizer)

# %%
runs = {"one process": [reference],
        "DDP": run_per_rank(data_parallel, 2, "gloo", "DDP"),
        "FSDP": run_per_rank(data_parallel, 2, "gloo", "FSDP"),
        "TP": run_per_rank(data_tensor, 2, "gloo", (1, 2)),
        "TP + SP": run_per_rank(sequence_parallel, 2, "gloo"),
        "CP (zig-zag)": run_per_rank(context_parallel, 2, "gloo"),
        "PP (GPipe, 2 micro-batches)": run_per_rank(data_pipeline, 2, "gloo", (1, 2)),
        "data × tensor (2 × 2)": dp_tp, "data × pipeline (2 × 2)": dp_pp}
for name in ("TP + SP", "CP (zig-zag)"):
    for rank, r in enumerate(runs[name]):
        diff = max(abs(a - b) for a, b in zip(r["losses"], reference["losses"]))
        print(f"{name}, rank {rank}: max |loss − one process's| over {STEPS} steps = {diff:.1e}")
        assert diff <= LOSS_TOL, (name, diff)

# %%
def kib(b):
    return f"{b / 1024:,.0f} KiB"


PICK = {
    "one process": "it fits and is fast enough: no communication at all",
    "DDP": "the model, its gradients and optimizer state fit on every device: the simplest, one all-reduce of 4Ψ a step",
    "FSDP": "that state does not fit: 1/N of it per rank, for more traffic (weights all-gathered, gradients reduce-scattered)",
    "TP": "one layer is too big or too slow for a device; fast links (an all-reduce of activations every block, forward and backward)",
    "TP + SP": "wherever TP is used: TP's weights, and the norms' activations split too, for more (smaller) collectives",
    "CP (zig-zag)": "sequences too long for one rank's activations: its positions only, for moving keys, values and gradients",
    "PP (GPipe, 2 micro-batches)": "the layers do not fit on one device and links are slow: only activations at the cut cross, but stages idle in the bubble",
    "data × tensor (2 × 2)": "TP inside a node (fast links), data parallel across nodes",
    "data × pipeline (2 × 2)": "PP across nodes or slow links, data parallel over the copies",
}
table = []
for name, ranks in runs.items():
    r0 = ranks[0]
    table.append({"strategy": name, "processes": len(ranks),
                  "state / rank (largest)": kib(max(r["state"] for r in ranks)),
                  "activations / rank (largest)": kib(max(r["activations"] for r in ranks)),
                  "collective payload / step (rank 0)": kib(r0["comm_bytes"]),
                  "collectives / step": f"{sum(r0['comm_calls'].values()):.1f}",
                  "step time": f"{1000 * max(r['step_s'] for r in ranks):.0f} ms",
                  "pick it when": PICK[name]})
print(format_table(table, list(table[0])))

# %% [markdown]
# The columns: the largest state any rank holds (parameters, gradients and AdamW's two
# moments, fp32: 16 bytes per parameter it holds); the most bytes autograd held for the
# backward at once on any rank (`ActivationMeter`, as in notebook 12; the parameters it
# is given are not counted, so FSDP's all-gathered weights, which its layers save for
# the backward, are); the payload of rank 0's collectives and sends per step, and how
# many there were; the slowest rank's median step time (on 4
# processes sharing this machine's cores, and whatever else runs on them: a time, not a
# verdict). What must hold, whatever the load:

# %%
state = {name: max(r["state"] for r in ranks) for name, ranks in runs.items()}
comm = {name: ranks[0]["comm_bytes"] for name, ranks in runs.items()}
full = 16 * PSI
print(f"16Ψ = {kib(full)}; state: " + ", ".join(f"{k} {kib(v)}" for k, v in state.items()))
assert state["one process"] == state["DDP"] == full
assert state["FSDP"] < 0.6 * full  # about half, plus the unsharded embeddings' padding
assert state["TP"] == state["data × tensor (2 × 2)"] < full  # the blocks split in two, the rest whole
assert state["PP (GPipe, 2 micro-batches)"] == state["data × pipeline (2 × 2)"] < full
assert comm["one process"] == 0
assert comm["DDP"] >= 4 * PSI and comm["FSDP"] > comm["DDP"]  # 4Ψ all-reduced, against 12Ψ moved
pp_activations = 2 * (GLOBAL_BATCH * SEQ * DIM * 4)  # the batch's activation at the cut, and its gradient
print(f"PP moves {kib(comm['PP (GPipe, 2 micro-batches)'])} a step on rank 0; the cut's activation and gradient: "
      f"{kib(pp_activations)}; DDP all-reduces {kib(comm['DDP'])}")
assert abs(comm["PP (GPipe, 2 micro-batches)"] - pp_activations) <= 0.02 * pp_activations  # + the first step's shapes
assert comm["PP (GPipe, 2 micro-batches)"] < comm["DDP"]
calls = {name: sum(ranks[0]["comm_calls"].values()) for name, ranks in runs.items()}
assert all(calls["TP"] > calls[name] for name in ("DDP", "FSDP", "PP (GPipe, 2 micro-batches)"))

# %% [markdown]
# And for the two strategies that split the sequence (on 2 processes, each with the
# whole batch, as TP):

# %%
kept = {name: max(r["activations"] for r in ranks) for name, ranks in runs.items()}
SP, CP = "TP + SP", "CP (zig-zag)"
for name in ("TP", SP, CP):
    print(f"{name:13} collectives per step on rank 0: "
          + ", ".join(f"{kind} ×{n:g}" for kind, n in sorted(runs[name][0]["comm_calls"].items())))
# notebook 12's count: each norm keeps its input (B, T, D) and a mean and 1/std per token (B, T)
norms = LAYERS * 2 * (GLOBAL_BATCH * SEQ * DIM + 2 * GLOBAL_BATCH * SEQ) * 4
print(f"activations: TP {kib(kept['TP'])}, TP + SP {kib(kept[SP])} (the norms' share (N−1)/N: "
      f"{kib(norms // 2)}), CP {kib(kept[CP])}, one process {kib(kept['one process'])}")
assert state[SP] == state["TP"]  # SP splits no weight
assert kept["TP"] - kept[SP] == norms // 2  # to the byte
assert calls[SP] > calls["TP"]
assert state[CP] == full  # every rank holds the whole model, as in DDP
assert kept[CP] < kept[SP] < kept["TP"] < kept["one process"]
assert kept[CP] < 0.6 * kept["one process"]  # its half of the positions, plus every layer's K and V
# K and V of every layer, gathered forward, their gradients reduce-scattered backward
assert {k: runs[CP][0]["comm_calls"][k] for k in ("all_gather", "reduce_scatter")} == {
    "all_gather": 2 * LAYERS, "reduce_scatter": 2 * LAYERS}
assert comm[CP] > comm["DDP"]  # DDP's gradient all-reduce, and the keys and values

# %% [markdown]
# What the table shows, for this model:
#
# - **DDP** holds all 16Ψ on every rank and all-reduces 4Ψ bytes of gradients a step;
#   **FSDP** holds about half (asserted: under 60%) and moves more (asserted):
#   all-gathers of the weights forward and backward, reduce-scatters of the gradients.
# - **Tensor parallel** holds the blocks' weights in halves; the embeddings, norms and
#   head stay whole (asserted: less than 16Ψ, the same with or without the data
#   dimension). It pays with collectives inside every block, forward and backward: more
#   calls than DDP, FSDP or PP (asserted), each on the critical path.
# - **TP + SP** holds exactly TP's state (asserted) and splits what TP leaves whole, the
#   norms' saved activations: fewer bytes kept by exactly their share, 2 norms × L ×
#   (B·T·D + 2·B·T) × 4 × (N−1)/N (asserted to the byte), for more collectives than TP
#   (asserted): each all-reduce becomes an all-gather and a reduce-scatter, plus the two
#   ends of the sequence-parallel region. Use it wherever TP is used.
# - **CP** holds the whole model on every rank, as DDP (asserted: 16Ψ) and keeps the
#   fewest activations of the strategies that give a rank the whole batch (asserted: less
#   than TP + SP's, under 60% of one process's: its half of the positions, plus every
#   layer's gathered keys and values). It moves DDP's gradient all-reduce *and* the keys
#   and values of every layer, forward (one all-gather each, asserted: 2L per step) and
#   their gradients backward (one reduce-scatter each, asserted), more than DDP (asserted).
#   Pick it for sequences whose activations do not fit even under TP + SP; on GPUs the
#   ring of notebook 13 hides the transfers behind the attention's compute. (The
#   collectives count high here because this notebook averages the gradients one
#   parameter at a time, where DDP sends them in buckets.)
# - **Pipeline parallel** holds one stage's weights and sends only the activation at the
#   cut and its gradient (asserted: within 2% of 2 × 8 × 64 × 64 × 4 bytes; the rest is
#   the shapes a new stage sends once), less than a gradient all-reduce here (asserted
#   against DDP), at the price of the bubble (notebook 11).
# - **The 2 × 2 meshes** hold what their tensor or pipeline half holds (asserted: equal
#   state) and add the data dimension's gradient all-reduce, over the part each rank
#   holds: that is how large runs stack the strategies, TP inside a node where links are
#   fastest, PP and data parallel across nodes.
#
# The step times are tiny and, on a shared CPU, dominated by the per-call cost of each
# collective: read them for their order of magnitude only. The counts and the bytes are
# what carries over to a large model on GPUs: scale Ψ, the activations and the
# collectives' bandwidth, and the same accounting says which strategy fits.
