"""Issue 35's families for exercises 10, 12, 13, 14 and 15 (tests/wrong_answer_families.py
says what they mean): the family of every wrong answer of these exercises, wherever it is
listed (tests/exercises/test_exercises.py, wrong_answers_layouts.py for 10, wrong_answers_parallel.py
for 12 and 13, wrong_answers_flops.py for 14, wrong_answers_trace.py for 15), which
families apply to each exercise and why the others do not; and ``WRONG_ANSWERS``, the
newer wrong answers of 10, 12, 13 and 14 (exercise 15's are in wrong_answers_trace.py's
``WRONG_ANSWERS_15``, which tests/exercises/test_exercise15.py grades), in the format of
test_exercises.py's list: (exercise, what the learner did, the change to the solution, what
the learner must read)."""

FAMILY = {}


def _tag(number, family, *names):
    for name in names:
        FAMILY[(number, name)] = family


# --- 15 reading a trace ---------------------------------------------------------------
_tag("15", "understanding", "the durations added up, overlaps counted twice",
     "the main thread's c10d calls counted as collectives", "the rank that waited longest taken for the slow one",
     "the collectives' own cost not subtracted", "the slow rank kept in the mean", "divided by one step",
     "a percentage")
_tag("15", "inputs", "the last rank taken for the slow one (notebook 15's straggler is the last)",
     "the ranks written in: 0, 1 and 2", "the mean over the two other ranks of a 3-rank run",
     "only gloo's collectives (the names of a CPU run)", "the ranges walked in the order of the file",
     "every range's end added beyond the last one, even a range inside another",
     "the waiting and the steps each summed over the other ranks, then divided",
     "every step taken to last as long as the first")
_tag("15", "robust", "the merged ranges returned, not their length",
     "the slow rank returned with its time (min over the dict's items)", "the slow rank's process name returned",
     "every event of the rank read before the names are filtered", "the time in collectives printed, not returned",
     "each other rank's share returned, not their mean")

APPLIES = {
    "15": ("inputs", "robust"),
}

NOT_APPLICABLE = {
    ("15", "layout"): "the three functions read a dict in one process: no process group, rank or world size "
                      "of their own. What a run's layout changes is the trace they read (how many ranks, "
                      "which one is slow); the check varies that (2, 3 and 4 ranks, the slow one first, in "
                      "the middle or last) and those answers are graded as inputs",
    ("15", "structure"): "the answer's own code has no structure to teach (no overlap, no memory held): it "
                         "computes three numbers from a trace, compared exactly with the reference's",
    ("15", "device"): "no tensor and no device: the functions read JSON. The one-machine habit it can carry, "
                      "knowing only gloo's 'gloo:' names, is graded as an input (the trace of a GPU run, "
                      "'nccl:' names)",
}

WRONG_ANSWERS = []

# --- 14 FLOPs and MFU -------------------------------------------------------------------
_tag("14", "understanding", "forward only (2N)", "attention forgotten", "one process's tokens, not the run's",
     "milliseconds taken for seconds", "the embedding tables counted", "a percentage", "the causal half of attention",
     "the MFU with integer division")
# a term below the old 2.5% tolerance: right on the benign (loose) comparison only
_tag("14", "inputs", "the biases and LayerNorm weights left out of N", "attention's backward counted once, not twice")
_tag("14", "robust", "a tensor returned", "the MFU as a formatted string")
APPLIES["14"] = ("layout", "inputs", "robust")
NOT_APPLICABLE[("14", "structure")] = (
    "two formulas, no parallel code: how the answer computes them has nothing to teach; the numbers it returns "
    "are compared exactly with the reference's")
NOT_APPLICABLE[("14", "device")] = (
    "no tensor, no device and no collective: step_flops reads sizes off the model, mfu divides three numbers")

_IDIST = "import ignite.distributed as idist\n    "
WRONG_ANSWERS += [
    # 14, layouts: right with one process, wrong on 2 nodes x 2 processes (or raising with no group)
    ("14", "the peak taken for one device's: multiplied by the world size",
     [("    return achieved / peak_flops", "    " + _IDIST + "return achieved / (peak_flops * idist.get_world_size())")],
     r"on 2 nodes x 2 processes \(world size 4, 2 per node\), rank 0: mfu\(6e\+12 FLOPs a step, .*returned 0\.15, not "
     r"0\.6: 1/4 of the reference's, that is, multiplied or divided by this run's world size"),
    ("14", "one process's share of the FLOPs: divided by the world size",
     [("    achieved = flops_per_step / (step_time_ms / 1000.0)",
       "    " + _IDIST + "achieved = flops_per_step / idist.get_world_size() / (step_time_ms / 1000.0)")],
     r"on 2 nodes x 2 processes \(world size 4, 2 per node\), rank 0: .*returned 0\.15, not 0\.6: 1/4 of the "
     r"reference's.*mfu needs no world size"),
    ("14", "the FLOPs summed over the ranks with all_reduce",
     [("    achieved = flops_per_step / (step_time_ms / 1000.0)",
       "    " + _IDIST + "flops_per_step = idist.all_reduce(float(flops_per_step))\n"
       "    achieved = flops_per_step / (step_time_ms / 1000.0)")],
     r"on 2 nodes x 2 processes \(world size 4, 2 per node\), rank 0: .*returned 2\.4, not 0\.6: 4x the reference's.*"
     r"\(or summed over the ranks\)"),
    ("14", "torch.distributed's world size in mfu (raises with no process group)",
     [("    return achieved / peak_flops",
       "    import torch.distributed as dist\n    return achieved / (peak_flops * dist.get_world_size())")],
     r"mfu\(6e\+12 FLOPs a step, a step every 500 ms, peak 2e\+13 FLOP/s\) raised ValueError: Default process group "
     r"has not been initialized.*With one process there is no process group: mfu and step_flops need none"),
    ("14", "the world size read from the environment in mfu (none without a launcher)",
     [("    return achieved / peak_flops",
       "    import os\n    return achieved / (peak_flops * int(os.environ[\"WORLD_SIZE\"]))")],
     r"mfu\(6e\+12 FLOPs a step, .*\) raised KeyError: 'WORLD_SIZE' \(line \d+: "),
    ("14", "step_flops counts the run it is called in, not the world_size asked about",
     [("tokens = batch_per_rank * world_size * T", _IDIST + "tokens = batch_per_rank * idist.get_world_size() * T")],
     r"that is ONE process's step: all 2 processes train batch_per_rank sequences each.*world_size the argument: "
     r"idist.get_world_size\(\) is the size of the run that calls step_flops, 1 here"),
    # 14, inputs: right on the example's shape or values only
    ("14", "T read from the wrong axis of pos_emb (its width, d_model: equal on a 64 x 64 GPT)",
     [("L, d, T = model.n_layer, model.d_model, model.block_size",
       "L, d, T = model.n_layer, model.d_model, model.pos_emb.weight.shape[1]")],
     r"d_model 64, block_size 32.*you used d_model where the block size T belongs"),
    ("14", "attention counted for one head's width",
     [("attention = 3 * L * (2 * T * d + 2 * T * d)",
       "head_dim = d // model.n_head\n    attention = 3 * L * (2 * T * head_dim + 2 * T * head_dim)")],
     r"you counted attention's products for one head's width, head_dim = d_model / n_head = 16"),
    ("14", "the MFU rounded to 2 decimals (exact on the example's 0.6)",
     [("    return achieved / peak_flops", "    return round(achieved / peak_flops, 2)")],
     r"returned [\d.e+-]+, not [\d.e+-]+: that is the fraction rounded to \d decimal\(s\); return it whole"),
    ("14", "the MFU computed with a torch tensor (float32)",
     [("    achieved = flops_per_step / (step_time_ms / 1000.0)  # FLOP per second\n    return achieved / peak_flops",
       "    import torch\n    achieved = torch.tensor(flops_per_step) / (step_time_ms / 1000.0)\n"
       "    return (achieved / peak_flops).item()")],
     r"mfu\(6e\+12 FLOPs a step, a step every 500 ms, peak 2e\+13 FLOP/s\) returned 0\.6000000\d+, not 0\.6: it agrees "
     r"with the reference to about 7 digits only: computed in single precision"),
    # 14, what the check must survive
    ("14", "step_flops computes the count and forgets to return it",
     [("    return (weights + attention) * tokens", "    flops = (weights + attention) * tokens")],
     r"step_flops returned None for the GPT \(n_layer 2, d_model 64, block_size 64, 4 sequences on each of 2 "
     r"process\(es\)\): return a number"),
    ("14", "step_flops returns the forward and the backward apart",
     [("    return (weights + attention) * tokens",
       "    forward = (weights + attention) * tokens // 3\n    return forward, 2 * forward")],
     r"step_flops returned a tuple of 2 for the GPT .*: return a number"),
    ("14", "the step time turned into seconds by floor division (0 s for 500 ms)",
     [("achieved = flops_per_step / (step_time_ms / 1000.0)", "achieved = flops_per_step / (step_time_ms // 1000)")],
     r"mfu\(6e\+12 FLOPs a step, a step every 500 ms, peak 2e\+13 FLOP/s\) raised ZeroDivisionError: float division "
     r"by zero \(line \d+: achieved = flops_per_step / \(step_time_ms // 1000\)"),
    ("14", "the model taken for a DDP wrapper (model.module)",
     [("L, d, T = model.n_layer, model.d_model, model.block_size",
       "model = model.module  # the model inside DDP\n    L, d, T = model.n_layer, model.d_model, model.block_size")],
     r"step_flops for the GPT \(n_layer 2, .*\) raised AttributeError: 'GPT' object has no attribute 'module'"),
]
_tag("14", "layout", *[name for n, name, *_ in WRONG_ANSWERS[:6]])
_tag("14", "inputs", *[name for n, name, *_ in WRONG_ANSWERS[6:10]])
_tag("14", "robust", *[name for n, name, *_ in WRONG_ANSWERS[10:14]])

# --- 10 sharded memory ------------------------------------------------------------------
_tag("10", "understanding", "FSDP predicted like DDP", "DDP divided by the world size too", "one Adam moment",
     "values, not bytes")
_tag("10", "layout", "a fixed 2 for the world size", "FSDP predicted like DDP on 2 ranks only (right on 3 and 4)", "a device mesh of the processes of one node (right on one node)",
     "FSDP shards by 2 however many ranks there are (right on 2)", "one process predicted as sharded in two",
     "the world size of this run, not the one asked about")
# what is held in memory, and when: the structure FSDP's lesson is about
_tag("10", "structure", "only the root sharded", "the root left out", "the root sharded before its layers", "layers kept whole after their forward",
     "layers and root kept whole after their forward", "only the first layer resharded after its forward",
     "one partial with reshard_after_forward=False for every unit")
_tag("10", "robust", "the model not returned")
APPLIES["10"] = ("layout", "structure", "robust")
NOT_APPLICABLE[("10", "inputs")] = (
    "the inputs are whole numbers (a parameter count, a world size, a strategy's name) and the answer is "
    "exact integer arithmetic, compared with the reference's for world sizes 1 to 8: no value's precision or "
    "magnitude can hide a mistake. Sizes that do not divide by the world size are outside the task, which "
    "says to assume equal shards (the check's models have layers whose rows divide by 2, 3 and 4)")
NOT_APPLICABLE[("10", "device")] = (
    "shard(model) hands no tensor to a collective and needs no device: fully_shard puts the shards on its "
    "default mesh's device (the run's), and predict_bytes_per_rank is arithmetic. A device named in shard "
    "(a mesh made by hand) raises here like the layout answer 'a device mesh of the processes of one node', "
    "whose message the check gives")

_N10 = len(WRONG_ANSWERS)
WRONG_ANSWERS += [
    ("10", "a 2-D mesh, nodes x processes per node (HSDP: right on one node)", '''
def shard(model):
    import ignite.distributed as idist
    from torch.distributed.device_mesh import init_device_mesh
    # shard within a node, replicate across the nodes
    mesh = init_device_mesh("cpu", (idist.get_nnodes(), idist.get_nproc_per_node()),
                            mesh_dim_names=("replicate", "shard"))
    for layer in model.modules():
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model
''', r"on 2 nodes x 2 processes: under your shard\(model\), rank 0 holds \d+ bytes of params \(measured\), but FSDP "
     r"over all 4 ranks leaves each \d+ \(1/4; 2x that\).*HSDP"),
    # 10, what the check must survive
    ("10", "the three numbers returned as a tuple", '''
def predict_bytes_per_rank(num_params, world_size, strategy):
    shards = world_size if strategy == "fsdp" else 1
    per_rank = FP32_BYTES * num_params // shards
    return per_rank, per_rank, 2 * per_rank  # params, grads, optimizer
''', r"predict_bytes_per_rank\(\.\.\., 'ddp'\) returned \(\d+, \d+, \d+\): return a dict with exactly the keys "
     r"'params', 'grads' and 'optimizer'"),
    ("10", "the optimizer's bytes under the key 'adam'",
     [('"optimizer": 2 * FP32_BYTES', '"adam": 2 * FP32_BYTES')],
     r"predict_bytes_per_rank\(\.\.\., 'ddp'\) returned \{'params': \d+, 'grads': \d+, 'adam': \d+\}: return a dict "
     r"with exactly the keys"),
    ("10", "the strategies compared in capitals (nothing returned for 'ddp')", '''
def predict_bytes_per_rank(num_params, world_size, strategy):
    if strategy == "DDP":
        shards = 1
    elif strategy == "FSDP":
        shards = world_size
    else:
        return None
    return {"params": FP32_BYTES * num_params // shards, "grads": FP32_BYTES * num_params // shards,
            "optimizer": 2 * FP32_BYTES * num_params // shards}
''', r"predict_bytes_per_rank\(\.\.\., 'ddp'\) returned None: return a dict"),
    ("10", "num_params taken for the model", '''
def predict_bytes_per_rank(num_params, world_size, strategy):
    count = sum(p.numel() for p in num_params.parameters())
    shards = world_size if strategy == "fsdp" else 1
    return {"params": FP32_BYTES * count // shards, "grads": FP32_BYTES * count // shards,
            "optimizer": 2 * FP32_BYTES * count // shards}
''', r"rank 0 raised AttributeError: 'int' object has no attribute 'parameters'.*in predict_bytes_per_rank"),
    ("10", "shard returns the sharded layers, not the model", '''
def shard(model):
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    return layers
''', r"shard\(model\) returned list, not the model: return the model you sharded"),
    ("10", "the model taken for a DDP wrapper (model.module)", '''
def shard(model):
    for layer in model.module.modules():  # the model inside the wrapper
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model
''', r"rank 0 raised AttributeError: 'Sequential' object has no attribute 'module'.*in shard"),
]
_tag("10", "layout", WRONG_ANSWERS[_N10][1])
_tag("10", "robust", *[name for n, name, *_ in WRONG_ANSWERS[_N10 + 1:]])

# --- 12 tensor-parallel MLP -----------------------------------------------------------------
_tag("12", "understanding", "no all-reduce", "the wrong shard of w2 (a strided slice of its columns)",
     "b2 added on every rank before the all-reduce", "the partial outputs averaged",
     "ReLU after the all-reduce (on the sum, not on each hidden unit)", "b2 added by rank 0 only, after the all-reduce")
_tag("12", "structure", "all-reduce after the column layer", "the whole MLP on every rank, nothing split",
     "the partial outputs all-gathered, then summed (a list output: the old recorder crashed on it)")
_tag("12", "layout", "the local rank for the global rank (right on one node, wrong on 2 x 2)",
     "the processes per node for the world size (right on one node, wrong on 2 x 2)",
     "an all-reduce with no process group (right on 2+, raises on 1 process)",
     "a world size of 2 written in (right on 2 processes only)")
_tag("12", "inputs", "the partial outputs summed in bfloat16")
_tag("12", "robust", "the output returned in a list", "nothing returned", "the output transposed")
APPLIES["12"] = ("layout", "inputs", "structure", "device", "robust")

_REDUCE = "        dist.all_reduce(partial)  #"
_N12 = len(WRONG_ANSWERS)
WRONG_ANSWERS += [
    # 12, layouts
    ("12", "the rank read from LOCAL_RANK (right on one node)",
     [("rank, n = idist.get_rank(), idist.get_world_size()",
       'import os\n    rank, n = int(os.environ.get("LOCAL_RANK", 0)), idist.get_world_size()')],
     r"on 2 nodes x 2 processes, rank 2 all-reduced a partial output that is not the one of its hidden units 12\.\.17 "
     r"\(it is the partial output of hidden units 0\.\.5: 24 // 4 units from 0\).*with r the GLOBAL rank"),
    ("12", "b2 added by local rank 0 before the all-reduce (once per node)",
     [("    partial = F.linear(hidden, w2[:, mine])",
       "    partial = F.linear(hidden, w2[:, mine])\n    if idist.get_local_rank() == 0:\n        partial = partial + b2"),
      ("    return partial + b2  #", "    return partial  #")],
     r"on 2 nodes x 2 processes, rank 0's output is the MLP's plus 1 × b2: 2 of the 4 ranks \(one per node\? "
     r"idist.get_local_rank\(\) is 0 once per node\) added b2 before the all-reduce"),
    ("12", "one process returns early, before b2 is added", '''
def tensor_parallel_mlp(x, w1, b1, w2, b2):
    rank, n = idist.get_rank(), idist.get_world_size()
    size = w1.shape[0] // n
    mine = slice(rank * size, (rank + 1) * size)
    partial = F.linear(F.relu(F.linear(x, w1[mine], b1[mine])), w2[:, mine])
    if n == 1:
        return partial  # one process: nothing to reduce
    dist.all_reduce(partial)
    return partial + b2
''', r"on 1 process \(no process group\), rank 0's output lacks b2"),
    ("12", "torch.distributed's rank and world size (raise with no process group)",
     [("rank, n = idist.get_rank(), idist.get_world_size()", "rank, n = dist.get_rank(), dist.get_world_size()")],
     r"on 1 process \(no process group\): rank 0 raised ValueError: Default process group has not been initialized"
     r".*in tensor_parallel_mlp"),
    # 12, inputs: right on values a lower precision holds, on positive pre-activations, on zero biases
    ("12", "the column layer computed in bfloat16 to save memory",
     [("    hidden = F.relu(F.linear(x, w1[mine], b1[mine]))",
       "    hidden = F.relu(F.linear(x.bfloat16(), w1[mine].bfloat16(), b1[mine].bfloat16())).float()")],
     r"on 2 processes, rank 0 all-reduced a partial output that is not the one of its hidden units 0\.\.11, but close "
     r"to it: .*the rounding of a lower precision \(bfloat16 or float16\)"),
    ("12", "the ReLU forgotten (right when every pre-activation is positive)",
     [("    hidden = F.relu(F.linear(x, w1[mine], b1[mine]))", "    hidden = F.linear(x, w1[mine], b1[mine])")],
     r"on 2 processes, rank 0 all-reduced a partial output that is not the one of its hidden units 0\.\.11: it is "
     r"their product without the ReLU"),
    ("12", "b1 forgotten (right when the biases are zero)",
     [("    hidden = F.relu(F.linear(x, w1[mine], b1[mine]))", "    hidden = F.relu(F.linear(x, w1[mine]))")],
     r"on 2 processes, rank 0 all-reduced a partial output that is not the one of its hidden units 0\.\.11: it is "
     r"their product without b1"),
    ("12", "a ReLU after the second layer too (right when every output is positive)",
     [("    return partial + b2  #", "    return F.relu(partial + b2)  #")],
     r"on 2 processes, rank 0's output is the MLP's with a ReLU applied to it: the MLP's second layer has no "
     r"activation"),
    ("12", "the products under autocast to bfloat16 (a speed-up, on CPU too)", '''
def tensor_parallel_mlp(x, w1, b1, w2, b2):
    rank, n = idist.get_rank(), idist.get_world_size()
    size = w1.shape[0] // n
    mine = slice(rank * size, (rank + 1) * size)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        partial = F.linear(F.relu(F.linear(x, w1[mine], b1[mine])), w2[:, mine])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(partial)
    return (partial + b2).float()
''', r"on 2 processes, rank 0 all-reduced a torch.bfloat16 tensor: the inputs are float32, and a sum in lower "
     r"precision loses digits"),
    # 12, structure: the right output, computed with other communication than one all-reduce
    ("12", "reduce to rank 0, then broadcast",
     [(_REDUCE, "        dist.reduce(partial, dst=0)\n        dist.broadcast(partial, src=0)  #")],
     r"on 2 processes, rank 0 made 2 call\(s\) of torch.distributed, \[\('reduce', \(8, 7\)\), \('broadcast', "
     r"\(8, 7\)\)\]: the split needs exactly one all-reduce"),
    ("12", "the whole hidden layer assembled with an all-reduce, then the whole second layer", '''
def tensor_parallel_mlp(x, w1, b1, w2, b2):
    rank, n = idist.get_rank(), idist.get_world_size()
    size = w1.shape[0] // n
    mine = slice(rank * size, (rank + 1) * size)
    hidden = torch.zeros(x.shape[0], w1.shape[0])
    hidden[:, mine] = F.relu(F.linear(x, w1[mine], b1[mine]))
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(hidden)  # every rank gets every hidden unit
    return F.linear(hidden, w2, b2)
''', r"on 2 processes, rank 0 all-reduced a tensor of shape \(8, 24\): the hidden activations after the column layer, "
     r"all of them.*assembling the whole hidden layer on every rank undoes the split"),
    ("12", "the partial outputs summed on rank 0 by send and recv, sent back", '''
def tensor_parallel_mlp(x, w1, b1, w2, b2):
    rank, n = idist.get_rank(), idist.get_world_size()
    size = w1.shape[0] // n
    mine = slice(rank * size, (rank + 1) * size)
    partial = F.linear(F.relu(F.linear(x, w1[mine], b1[mine])), w2[:, mine])
    if n > 1:
        if rank == 0:
            for other in range(1, n):
                part = torch.empty_like(partial)
                dist.recv(part, src=other)
                partial += part
            for other in range(1, n):
                dist.send(partial, dst=other)
        else:
            dist.send(partial, dst=0)
            dist.recv(partial, src=0)
    return partial + b2
''', r"on 2 processes, rank 0 made 2 call\(s\) of torch.distributed, \[\('recv', \(8, 7\)\), \('send', \(8, 7\)\)\]: "
     r"the split needs exactly one all-reduce"),
    ("12", "the hidden slices all-gathered, then the whole second layer", '''
def tensor_parallel_mlp(x, w1, b1, w2, b2):
    rank, n = idist.get_rank(), idist.get_world_size()
    size = w1.shape[0] // n
    mine = slice(rank * size, (rank + 1) * size)
    hidden = F.relu(F.linear(x, w1[mine], b1[mine]))
    if n > 1:
        parts = [torch.empty_like(hidden) for _ in range(n)]
        dist.all_gather(parts, hidden)
        hidden = torch.cat(parts, dim=1)
    return F.linear(hidden, w2, b2)
''', r"on 2 processes, rank 0 handed all_gather \(one of 1 call\(s\)\) a tensor of shape \(8, 12\): the hidden "
     r"activations after the column layer.*nothing needs to travel between the two layers"),
    # 12, code written for a GPU machine: a device named (no GPU here: it raises, and the message says so)
    ("12", "the partial output moved to 'cuda' for the all-reduce (nccl wants GPU tensors)",
     [(_REDUCE, '        partial = partial.to("cuda")\n        dist.all_reduce(partial)\n        partial = partial.cpu()  #')],
     r"on 2 processes: rank 0 raised (RuntimeError|AssertionError): .*a tensor or module was put on a GPU by name.*"
     r"Use idist.device\(\)"),
    ("12", "the inputs moved to cuda:RANK (the global rank)",
     [("    size = w1.shape[0] // n",
       '    device = torch.device(f"cuda:{rank}")\n'
       "    x, w1, b1, w2, b2 = (t.to(device) for t in (x, w1, b1, w2, b2))\n    size = w1.shape[0] // n")],
     r"on 2 processes: rank 0 raised (RuntimeError|AssertionError): .*put on a GPU by name"),
    ("12", "torch.cuda.set_device(local rank) first",
     [("    size = w1.shape[0] // n", "    torch.cuda.set_device(idist.get_local_rank())\n    size = w1.shape[0] // n")],
     r"on 2 processes: rank 0 raised (RuntimeError|AssertionError): .*put on a GPU by name"),
    ("12", "the hidden activations computed with .cuda() weights",
     [("    hidden = F.relu(F.linear(x, w1[mine], b1[mine]))",
       "    hidden = F.relu(F.linear(x.cuda(), w1[mine].cuda(), b1[mine].cuda())).cpu()")],
     r"on 2 processes: rank 0 raised (RuntimeError|AssertionError): .*put on a GPU by name"),
    ("12", "the result buffer made on torch.device('cuda', local rank)", '''
def tensor_parallel_mlp(x, w1, b1, w2, b2):
    rank, n = idist.get_rank(), idist.get_world_size()
    size = w1.shape[0] // n
    mine = slice(rank * size, (rank + 1) * size)
    out = torch.zeros(x.shape[0], w2.shape[0], device=torch.device("cuda", idist.get_local_rank()))
    out += F.linear(F.relu(F.linear(x, w1[mine], b1[mine])), w2[:, mine]).to(out.device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(out)
    return out.cpu() + b2
''', r"on 2 processes: rank 0 raised (RuntimeError|AssertionError): .*put on a GPU by name"),
    ("12", "idist.all_reduce of a tensor put on 'cuda'",
     [("    if dist.is_available() and dist.is_initialized():\n" + _REDUCE,
       '    if True:\n        partial = idist.all_reduce(partial.to("cuda")).cpu()  #')],
     r"on 2 processes: rank 0 raised (RuntimeError|AssertionError): .*put on a GPU by name"),
    # 12, what the check must survive and describe
    ("12", "computed in float64 for accuracy",
     [("    hidden = F.relu(F.linear(x, w1[mine], b1[mine]))",
       "    x, w1, b1, w2, b2 = (t.double() for t in (x, w1, b1, w2, b2))\n"
       "    hidden = F.relu(F.linear(x, w1[mine], b1[mine]))")],
     r"on 2 processes, rank 0 all-reduced a torch.float64 tensor: the inputs are float32, and the output must be "
     r"float32 too"),
    ("12", "only rank 0 all-reduces (it alone prints the output)",
     [("    if dist.is_available() and dist.is_initialized():\n" + _REDUCE,
       "    if dist.is_available() and dist.is_initialized() and rank == 0:\n" + _REDUCE)],
     r"on 2 processes: rank 0 was still waiting( for \d+ s)? in a collective when rank 1 had already finished"),
    ("12", "w2's rows taken for its columns (a shape error)",
     [("partial = F.linear(hidden, w2[:, mine])", "partial = F.linear(hidden, w2[mine])")],
     r"on 2 processes: rank 0 raised RuntimeError: .*mat1 and mat2 shapes cannot be multiplied.*in tensor_parallel_mlp"),
]
_tag("12", "layout", *[a[1] for a in WRONG_ANSWERS[_N12:_N12 + 4]])
_tag("12", "inputs", *[a[1] for a in WRONG_ANSWERS[_N12 + 4:_N12 + 9]])
_tag("12", "structure", *[a[1] for a in WRONG_ANSWERS[_N12 + 9:_N12 + 13]])
_tag("12", "device", *[a[1] for a in WRONG_ANSWERS[_N12 + 13:_N12 + 19]])
_tag("12", "robust", *[a[1] for a in WRONG_ANSWERS[_N12 + 19:]])

# --- 13 ring attention ----------------------------------------------------------------------
_tag("13", "understanding", "no 1/sqrt(d) scaling", "the online-softmax rescale forgotten",
     "no causal mask on the diagonal block", "the mask keeps out the diagonal itself", "the ring turned the wrong way",
     "later ranks' blocks not skipped")
_tag("13", "structure", "the whole sequence gathered", "waits for the next block before computing on the current one",
     "keeps every block it received (collects the sequence)")
_tag("13", "robust", "blocks sent two ranks on (a ring that skips a neighbour)", "the rows returned in a list")
_tag("13", "inputs", "the running maximum started at 0", "the scores computed in bfloat16")
_tag("13", "layout", "torch.distributed's rank (right with a process group, raises on 1 process)",
     "the local rank for the rank (right on one node, wrong on 2 x 2)")
APPLIES["13"] = ("layout", "inputs", "structure", "device", "robust")

_SCORES = "scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])"
_SEND = "dist.P2POp(dist.isend, k, (rank + 1) % n), dist.P2POp(dist.isend, v, (rank + 1) % n)"
_RECV = "dist.P2POp(dist.irecv, k_next, (rank - 1) % n), dist.P2POp(dist.irecv, v_next, (rank - 1) % n)"
_GPU = r"on 2 processes: rank 0 raised (RuntimeError|AssertionError): .*put on a GPU by name"
# one block merged into the running m, l, acc (the reference's arithmetic), for answers written whole
_MERGE = '''
def _merge(q, k, v, m, l, acc, diagonal):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if diagonal:
        scores = scores.masked_fill(causal_mask(q.shape[-2]), float("-inf"))
    m_new = torch.maximum(m, scores.amax(dim=-1))
    p = torch.exp(scores - m_new[..., None])
    rescale = torch.exp(m - m_new)
    return m_new, l * rescale + p.sum(dim=-1), acc * rescale[..., None] + p @ v
'''
_N13 = len(WRONG_ANSWERS)
WRONG_ANSWERS += [
    # 13, layouts
    ("13", "the block held taken for the previous rank's at every step after the first (right on 2)",
     [("        source = (rank - step) % n  #", "        source = rank if step == 0 else (rank - 1) % n  #")],
     r"on 3 processes, rank 1: its rows: \d+ of \d+ entries differ.*the block held at step s is rank \(r - s\) % N's"),
    ("13", "one process: plain attention, without the causal mask", '''
_ring = ring_attention


def ring_attention(q, k, v):
    if idist.get_world_size() == 1:  # no ring with one process: plain attention
        return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v
    return _ring(q, k, v)
''', r"on 1 process \(no process group\), ranks \[0\] returned other rows than the reference: the diagonal block "
     r"\(this rank's own keys\) was not masked"),
    ("13", "a ring of two: the other rank is 1 - rank (right on 2)",
     [(_SEND, "dist.P2POp(dist.isend, k, 1 - rank), dist.P2POp(dist.isend, v, 1 - rank)"),
      (_RECV, "dist.P2POp(dist.irecv, k_next, 1 - rank), dist.P2POp(dist.irecv, v_next, 1 - rank)")],
     r"on 3 processes: rank 2 called dist.isend to rank -1, but the ranks are 0 to 2: a neighbour on the ring is "
     r"\(rank \+ 1\) % N or \(rank - 1\) % N"),
    ("13", "as many steps as processes per node (right on one node)",
     [("    for step in range(n):", "    for step in range(idist.get_nproc_per_node()):")],
     r"on 2 nodes x 2 processes, rank 0 sent 4 and received 4 tensor\(s\) of shapes \[\(2, 2, 5, 8\)\]: a ring of 4 "
     r"passes each rank's keys and values on 3 time\(s\)"),
    # 13, inputs: right on attention scores of order 1 only
    ("13", "exp(score) with no maximum subtracted (fine for scores of order 1)",
     [("            m_new = torch.maximum(m, scores.amax(dim=-1))", "            m_new = torch.zeros_like(m)")],
     r"on 2 processes, rank 0: its rows holds NaN at \d+ of 160 entries.*DISTKIT_CHECK_SEED=\d+ replays"),
    ("13", "the scores clamped to +-50 to keep exp finite",
     [(_SCORES, _SCORES.replace("scores = ", "scores = (") + ").clamp(-50, 50)")],
     r"on 2 processes, rank \d: its rows: \d+ of 160 entries differ.*DISTKIT_CHECK_SEED=\d+ replays"),
    ("13", "the running maximum taken over the unscaled scores",
     [(_SCORES, "raw = q @ k.transpose(-2, -1)\n            scores = raw / math.sqrt(q.shape[-1])"),
      ("m_new = torch.maximum(m, scores.amax(dim=-1))", "m_new = torch.maximum(m, raw.amax(dim=-1))")],
     r"on 2 processes, rank 0: its rows holds NaN at \d+ of 160 entries"),
    ("13", "one maximum for the whole block (amax without dim)",
     [("m_new = torch.maximum(m, scores.amax(dim=-1))", "m_new = torch.maximum(m, scores.max())")],
     r"on 2 processes, rank 0: its rows holds NaN at \d+ of 160 entries"),
    # 13, structure: the right rows, computed the wrong way
    ("13", "blocking send and recv (even ranks send first)", _MERGE + '''

def ring_attention(q, k, v):
    rank, n = idist.get_rank(), idist.get_world_size()
    m, l, acc = torch.full(q.shape[:-1], float("-inf")), torch.zeros(q.shape[:-1]), torch.zeros_like(q)
    for step in range(n):
        source = (rank - step) % n
        if source <= rank:
            m, l, acc = _merge(q, k, v, m, l, acc, source == rank)
        if step < n - 1:
            k_next, v_next = torch.empty_like(k), torch.empty_like(v)
            if rank % 2 == 0:
                dist.send(k, (rank + 1) % n); dist.send(v, (rank + 1) % n)
                dist.recv(k_next, (rank - 1) % n); dist.recv(v_next, (rank - 1) % n)
            else:
                dist.recv(k_next, (rank - 1) % n); dist.recv(v_next, (rank - 1) % n)
                dist.send(k, (rank + 1) % n); dist.send(v, (rank + 1) % n)
            k, v = k_next, v_next
    return acc / l[..., None]
''', r"on 2 processes, rank 0 computed on a block while the next one was in flight 0 time\(s\) of 1: it waited for a "
     r"block \(or received it with a blocking recv\)"),
    ("13", "each block sent straight to every later rank (no ring)", _MERGE + '''

def ring_attention(q, k, v):
    rank, n = idist.get_rank(), idist.get_world_size()
    sends = [dist.isend(t, later) for later in range(rank + 1, n) for t in (k, v)]
    m, l, acc = _merge(q, k, v, torch.full(q.shape[:-1], float("-inf")), torch.zeros(q.shape[:-1]),
                       torch.zeros_like(q), True)
    for earlier in range(rank):
        k_e, v_e = torch.empty_like(k), torch.empty_like(v)
        dist.recv(k_e, earlier); dist.recv(v_e, earlier)
        m, l, acc = _merge(q, k_e, v_e, m, l, acc, False)
    for request in sends:
        request.wait()
    return acc / l[..., None]
''', r"on 2 processes, rank 0 sent 2 block\(s\) but received none: in a ring EVERY rank, at each step but the last"),
    ("13", "every block collected round the ring, then one softmax", '''
def ring_attention(q, k, v):
    rank, n = idist.get_rank(), idist.get_world_size()
    keys, values = [k], [v]  # keys[s]: the block of rank (rank - s) % n
    for step in range(n - 1):
        k_next, v_next = torch.empty_like(k), torch.empty_like(v)
        for request in dist.batch_isend_irecv([
                dist.P2POp(dist.isend, keys[-1], (rank + 1) % n), dist.P2POp(dist.isend, values[-1], (rank + 1) % n),
                dist.P2POp(dist.irecv, k_next, (rank - 1) % n), dist.P2POp(dist.irecv, v_next, (rank - 1) % n)]):
            request.wait()
        keys.append(k_next)
        values.append(v_next)
    mine = [s for s in range(n) if (rank - s) % n <= rank]
    mine.sort(key=lambda s: (rank - s) % n)  # in the order of the sequence
    K, V = torch.cat([keys[s] for s in mine], dim=-2), torch.cat([values[s] for s in mine], dim=-2)
    size = q.shape[-2]
    scores = q @ K.transpose(-2, -1) / math.sqrt(q.shape[-1])
    later = torch.arange(K.shape[-2])[None, :] > torch.arange(rank * size, (rank + 1) * size)[:, None]
    return torch.softmax(scores.masked_fill(later, float("-inf")), dim=-1) @ V
''', r"on 2 processes, rank 0 computed on a block while the next one was in flight 0 time\(s\) of 1"),
    ("13", "the exchange posted at the last step too (a block sent that nobody uses)",
     [("        if step < n - 1:  # pass the block on", "        if n > 1:  # pass the block on"),
      ("        if step < n - 1:\n            for request in requests:", "        if n > 1:\n            for request in requests:")],
     r"on 2 processes, rank 0 sent 4 and received 4 tensor\(s\) of shapes \[\(2, 2, 5, 8\)\]: a ring of 2 passes each "
     r"rank's keys and values on 1 time\(s\)"),
    ("13", "every rank's block broadcast in turn", _MERGE + '''

def ring_attention(q, k, v):
    rank, n = idist.get_rank(), idist.get_world_size()
    m, l, acc = torch.full(q.shape[:-1], float("-inf")), torch.zeros(q.shape[:-1]), torch.zeros_like(q)
    for source in range(n):
        kb, vb = (k, v) if source == rank else (torch.empty_like(k), torch.empty_like(v))
        if n > 1:
            dist.broadcast(kb, src=source)
            dist.broadcast(vb, src=source)
        if source <= rank:
            m, l, acc = _merge(q, kb, vb, m, l, acc, source == rank)
    return acc / l[..., None]
''', r"on 2 processes, rank 0 used the collective\(s\) \['broadcast'\], 4 call\(s\) of torch.distributed: a collective "
     r"makes every rank wait"),
    # 13, code written for a GPU machine
    ("13", "the running maximum made on 'cuda'",
     [('    m = torch.full(rows, float("-inf"), device=q.device)', '    m = torch.full(rows, float("-inf"), device="cuda")')],
     _GPU),
    ("13", "the receive buffers made on 'cuda' (nccl wants GPU tensors)",
     [("k_next, v_next = torch.empty_like(k), torch.empty_like(v)",
       'k_next, v_next = torch.empty_like(k, device="cuda"), torch.empty_like(v, device="cuda")')], _GPU),
    ("13", "torch.cuda.set_device(global rank) first",
     [("    rows = q.shape[:-1]", "    torch.cuda.set_device(rank)\n    rows = q.shape[:-1]")], _GPU),
    ("13", "the blocks moved with .cuda()",
     [("    rows = q.shape[:-1]", "    q, k, v = q.cuda(), k.cuda(), v.cuda()\n    rows = q.shape[:-1]")], _GPU),
    ("13", "the accumulator on torch.device('cuda', local rank)",
     [("    acc = torch.zeros_like(q)  #", '    acc = torch.zeros_like(q, device=torch.device("cuda", idist.get_local_rank()))  #')],
     _GPU),
    ("13", "the causal mask moved with .cuda()",
     [("causal_mask(q.shape[-2]).to(q.device), float", "causal_mask(q.shape[-2]).cuda(), float")], _GPU),
    # 13, what the check must survive and describe
    ("13", "the rows computed and not returned", [("    return acc / l[..., None]", "    out = acc / l[..., None]")],
     r"on 2 processes, rank 0 returned None: return this rank's rows of the attention"),
    ("13", "the running statistics returned with the rows (for a backward)",
     [("    return acc / l[..., None]", "    return acc / l[..., None], (m, l)")],
     r"on 2 processes, rank 0 returned a tuple of 2: return this rank's rows"),
    ("13", "the last rank passes nothing on (nobody after it needs its block)", '''
def ring_attention(q, k, v):
    rank, n = idist.get_rank(), idist.get_world_size()
    m, l, acc = torch.full(q.shape[:-1], float("-inf")), torch.zeros(q.shape[:-1]), torch.zeros_like(q)
    for step in range(n):
        requests = []
        if step < n - 1:
            k_next, v_next = torch.empty_like(k), torch.empty_like(v)
            ops = [dist.P2POp(dist.irecv, k_next, (rank - 1) % n), dist.P2POp(dist.irecv, v_next, (rank - 1) % n)]
            if rank < n - 1:
                ops = [dist.P2POp(dist.isend, k, rank + 1), dist.P2POp(dist.isend, v, rank + 1)] + ops
            requests = dist.batch_isend_irecv(ops)
        source = (rank - step) % n
        if source <= rank:
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            if source == rank:
                scores = scores.masked_fill(causal_mask(q.shape[-2]), float("-inf"))
            m_new = torch.maximum(m, scores.amax(dim=-1))
            p = torch.exp(scores - m_new[..., None])
            rescale = torch.exp(m - m_new)
            l, acc, m = l * rescale + p.sum(dim=-1), acc * rescale[..., None] + p @ v, m_new
        for request in requests:
            request.wait()
        if requests:
            k, v = k_next, v_next
    return acc / l[..., None]
''', r"on 2 processes: rank 0 was still waiting( for \d+ s)? for a point-to-point transfer when rank 1 had already "
     r"finished: a recv \(or a send\) whose peer never made the matching call"),
    ("13", "the causal mask sized by head_dim (a shape error)",
     [("causal_mask(q.shape[-2]).to(q.device), float", "causal_mask(q.shape[-1]).to(q.device), float")],
     r"on 2 processes: rank \d raised RuntimeError: The size of tensor a \((5|8)\) must match the size of tensor b "
     r"\((5|8)\)"),
    ("13", "the rows returned in bfloat16 (half the memory)",
     [("    return acc / l[..., None]", "    return (acc / l[..., None]).bfloat16()")],
     r"on 2 processes, rank 0 returned a bfloat16 tensor of shape \(2, 2, 5, 8\): its rows should be a float32 tensor"),
]
_tag("13", "layout", *[a[1] for a in WRONG_ANSWERS[_N13:_N13 + 4]])
_tag("13", "inputs", *[a[1] for a in WRONG_ANSWERS[_N13 + 4:_N13 + 8]])
_tag("13", "structure", *[a[1] for a in WRONG_ANSWERS[_N13 + 8:_N13 + 13]])
_tag("13", "device", *[a[1] for a in WRONG_ANSWERS[_N13 + 13:_N13 + 19]])
_tag("13", "robust", *[a[1] for a in WRONG_ANSWERS[_N13 + 19:]])
