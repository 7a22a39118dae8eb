"""Plausible wrong answers to exercises 01, 06, 07, 10 and 11 that only the layouts, the
inputs or the structure the checks now use can catch (issue 35's families), in the format
of ``WRONG_ANSWERS`` in test_exercises.py, which grades them with the others:
(exercise, what the learner did, the change to the solution, what the learner must read).

Families, as the issue names them: wrong on ONE layout only (world size 1 with no
process group, 3 processes, 2 nodes x 2 processes), right on benign inputs only (values
that bfloat16 holds, the task's own example settings), wrong structure (a pipeline with
no middle stage), and code written for one machine (a GPU named, not ``idist.device()``).
"""

WRONG_ANSWERS_LAYOUTS = [
    # --- 01 collectives: wrong on one layout only -------------------------------------
    ("01", "torch.distributed's world size (raises with no process group)",
     [("return total / idist.get_world_size()",
       "import torch.distributed as dist\n    return total / dist.get_world_size()")],
     r"on 1 process \(no process group\): rank 0 raised ValueError: Default process group has not been "
     r"initialized.*01_collectives.py"),
    ("01", "the world size read from the environment (none without a launcher)",
     [("return total / idist.get_world_size()",
       'import os\n    return total / int(os.environ["WORLD_SIZE"])')],
     r"on 1 process \(no process group\): rank 0 raised KeyError: 'WORLD_SIZE'"),
    ("01", "a bare dist.all_reduce on a tensor (raises with no process group)",
     [("    total = idist.all_reduce(float(value))\n",
       "    import torch, torch.distributed as dist\n    t = torch.tensor(float(value), dtype=torch.float64)\n"
       "    dist.all_reduce(t)\n    total = t.item()\n")],
     r"on 1 process \(no process group\): rank 0 raised ValueError: Default process group has not been initialized"),
    ("01", "divided by LOCAL_WORLD_SIZE from the environment (right on one node)",
     [("return total / idist.get_world_size()",
       'import os\n    return total / int(os.environ.get("LOCAL_WORLD_SIZE", 1))')],
     r"on 2 nodes of 2 processes each \(world size 4\): rank 0 returned 8\.0, the sum 16\.0 divided by 2, the "
     r"processes of ONE node"),
    ("01", "all_gather, then the mean of this node's ranks (right on one node)",
     [("    total = idist.all_reduce(float(value))\n    # Every rank divides by the same world size, so every rank gets the same mean.\n    return total / idist.get_world_size()",
       "    values = idist.all_gather(float(value))\n    n = idist.get_nproc_per_node()\n"
       "    return sum(values[:n]) / n")],
     r"on 2 nodes of 2 processes each \(world size 4\): rank 0 returned 2\.5, but the values of the ranks are "
     r"\[1\.0, 4\.0, 2\.0, 9\.0\], their average is 4\.0"),
    ("01", "the mean of my value and the other rank's (right on 2 processes)",
     [("    total = idist.all_reduce(float(value))\n    # Every rank divides by the same world size, so every rank gets the same mean.\n    return total / idist.get_world_size()",
       "    values = idist.all_gather(float(value))\n"
       "    return (values[0] + values[-1]) / 2")],
     r"on 3 processes: rank 0 returned 1\.75, but the values of the ranks are \[1\.0, 4\.0, 2\.5\]"),
    # --- 01: right on benign inputs only ----------------------------------------------
    ("01", "a bfloat16 all_reduce (the fixed values are exact in bfloat16)",
     [("total = idist.all_reduce(float(value))",
       "total = idist.all_reduce(torch.tensor(float(value), dtype=torch.bfloat16)).item()"),
      ("import ignite.distributed as idist", "import ignite.distributed as idist\nimport torch")],
     r"with random values \(random inputs of seed \d+: DISTKIT_CHECK_SEED=\d+ replays them\), rank 0: "
     r"average_across_ranks\(.*\) should return .*the reference solution's mean.*: the all_reduce was given a "
     r"bfloat16 tensor"),
    ("01", "a float16 all_reduce",
     [("total = idist.all_reduce(float(value))",
       "total = idist.all_reduce(torch.tensor(float(value)).half()).item()"),
      ("import ignite.distributed as idist", "import ignite.distributed as idist\nimport torch")],
     r"with (random|adversarial) values .*rank 0: average_across_ranks\(.*the all_reduce was given a float16 tensor"),
    ("01", "the values taken as whole numbers (int)",
     [("idist.all_reduce(float(value))", "idist.all_reduce(int(value))")],
     r"on 3 processes: .*rank 0 returned 2\.3333333333333335, but the values of the ranks are \[1\.0, 4\.0, 2\.5\]"
     r"|with random values .*should return"),
    ("01", "the mean rounded to 2 decimals for the log",
     [("return total / idist.get_world_size()", "return round(total / idist.get_world_size(), 2)")],
     r"with (random|adversarial) values .*rank 0: average_across_ranks\(.*\) should return .*, got "),
    ("01", "the absolute values averaged (a loss is never negative... other numbers are)",
     [("idist.all_reduce(float(value))", "idist.all_reduce(abs(float(value)))")],
     r"with (random|adversarial) values .*should return .*the reference solution's mean of \["),
    ("01", "the values summed in float32, then the mean in float16 for the log",
     [("return total / idist.get_world_size()",
       "return float(torch.tensor(total / idist.get_world_size()).half())"),
      ("import ignite.distributed as idist", "import ignite.distributed as idist\nimport torch")],
     r"with (random|adversarial) values .*should return .*, got "),
    # --- 01: code written for one GPU machine -----------------------------------------
    ("01", "a tensor put on 'cuda' by name",
     [("total = idist.all_reduce(float(value))",
       'total = idist.all_reduce(torch.tensor(float(value), device="cuda")).item()'),
      ("import ignite.distributed as idist", "import ignite.distributed as idist\nimport torch")],
     r"rank 0 raised RuntimeError: Found no NVIDIA driver.*a tensor or module was put on a GPU by name.*Use "
     r"idist.device\(\)"),
    ("01", "the device chosen by global rank (cuda:RANK)",
     [("total = idist.all_reduce(float(value))",
       'device = torch.device(f"cuda:{idist.get_rank()}")\n'
       "    total = idist.all_reduce(torch.tensor(float(value), device=device)).item()"),
      ("import ignite.distributed as idist", "import ignite.distributed as idist\nimport torch")],
     r"rank 0 raised RuntimeError: Found no NVIDIA driver.*put on a GPU by name"),
    ("01", "torch.cuda.set_device(global rank) first",
     [("    total = idist.all_reduce(float(value))\n",
       "    torch.cuda.set_device(idist.get_rank())\n    total = idist.all_reduce(float(value))\n"),
      ("import ignite.distributed as idist", "import ignite.distributed as idist\nimport torch")],
     r"rank 0 raised RuntimeError: .*put on a GPU by name"),
    ("01", "the tensor moved with .cuda()",
     [("total = idist.all_reduce(float(value))",
       "total = idist.all_reduce(torch.tensor(float(value)).cuda()).item()"),
      ("import ignite.distributed as idist", "import ignite.distributed as idist\nimport torch")],
     r"rank 0 raised RuntimeError: Found no NVIDIA driver.*put on a GPU by name"),
    ("01", "torch.device('cuda', local rank) (right on a GPU node, not on a CPU)",
     [("total = idist.all_reduce(float(value))",
       'total = idist.all_reduce(torch.tensor(float(value), device=torch.device("cuda", idist.get_local_rank()))).item()'),
      ("import ignite.distributed as idist", "import ignite.distributed as idist\nimport torch")],
     r"rank 0 raised RuntimeError: Found no NVIDIA driver.*Use idist.device\(\)"),
    # --- 06 learning-rate scaling: wrong on one layout only ---------------------------
    ("06", "torch.distributed's world size (raises with no process group)",
     [("peak = base_lr * idist.get_world_size()",
       "import torch.distributed as dist\n    peak = base_lr * dist.get_world_size()")],
     r"on 1 process \(no process group\): rank 0 raised ValueError: Default process group has not been initialized"),
    ("06", "the world size read from the environment",
     [("peak = base_lr * idist.get_world_size()",
       'import os\n    peak = base_lr * int(os.environ["WORLD_SIZE"])')],
     r"on 1 process \(no process group\): rank 0 raised KeyError: 'WORLD_SIZE'"),
    ("06", "scaled by LOCAL_WORLD_SIZE from the environment (right on one node)",
     [("peak = base_lr * idist.get_world_size()",
       'import os\n    peak = base_lr * int(os.environ.get("LOCAL_WORLD_SIZE", 1))')],
     r"on 2 nodes of 2 processes each \(world size 4\), rank 0's highest learning rate is 0\.2, base_lr x 2: "
     r"that counts the processes of ONE node"),
    ("06", "scaled by the GPUs of this machine (none here)",
     [("peak = base_lr * idist.get_world_size()",
       "import torch\n    peak = base_lr * max(torch.cuda.device_count(), 1)")],
     r"with 2 processes the highest learning rate is 0\.1, the unscaled base_lr"),
    ("06", "scaled by the rank + 1 (a rank is not a count)",
     [("peak = base_lr * idist.get_world_size()", "peak = base_lr * (idist.get_rank() + 1)")],
     r"with 2 processes the highest learning rate is 0\.1, the unscaled base_lr"),
    ("06", "the square-root scaling rule",
     [("peak = base_lr * idist.get_world_size()", "peak = base_lr * idist.get_world_size() ** 0.5")],
     r"with 2 processes the highest learning rate is 0\.141421, but it should be base_lr x world size"),
    # --- 06: right on the task's example only -----------------------------------------
    ("06", "the warm-up of the example (4 steps) written in",
     [("(warmup_iters, peak),", "(4, peak),")],
     r"rank 0, create_lr_scheduler\(optimizer, base_lr=[0-9.]+, warmup_iters=\d, total_iters=\d+\) with \d "
     r"process\(es\): the learning rate of iteration \d+ \(step \d+\) is [0-9.e-]+, expected [0-9.e-]+ \(the "
     r"reference solution's.*DISTKIT_CHECK_SEED"),
    ("06", "the length of the example (12 steps) written in",
     [("(total_iters, 0.0),", "(12, 0.0),")],
     r"create_lr_scheduler\(optimizer, base_lr=[0-9.]+, warmup_iters=\d, total_iters=\d+\) .*: the learning "
     r"rate of iteration \d+ \(step \d+\) is [0-9.e-]+, expected [0-9.e-]+"),
    ("06", "the example's base_lr (0.1) written in",
     [("peak = base_lr * idist.get_world_size()", "peak = 0.1 * idist.get_world_size()")],
     r"create_lr_scheduler\(optimizer, base_lr=[0-9.]+, .*: the learning rate of iteration \d+ \(step \d+\) is "
     r"[0-9.e-]+, expected [0-9.e-]+"),
    ("06", "the peak rounded to 2 decimals",
     [("peak = base_lr * idist.get_world_size()", "peak = round(base_lr * idist.get_world_size(), 2)")],
     r"create_lr_scheduler\(optimizer, base_lr=[0-9.]+, .*: the learning rate of iteration \d+ \(step \d+\) is "
     r"[0-9.e-]+, expected [0-9.e-]+"),
    ("06", "the warm-up as a fixed third of the run (4 of 12 in the example)",
     [("(warmup_iters, peak),", "(total_iters // 3, peak),")],
     r"create_lr_scheduler\(optimizer, base_lr=[0-9.]+, warmup_iters=\d, total_iters=\d+\) .*: the learning "
     r"rate of iteration \d+ \(step \d+\) is"),
    ("06", "the decay to base_lr / 10 at the end (ends at 0 only if ... never)",
     [("(total_iters, 0.0),", "(total_iters, base_lr / 10),")],
     r"the learning rate at step \d+ is [0-9.]+, expected [0-9.]+ \(linear decay to 0 at step total_iters\)"),
    # --- 07 checkpoints: wrong on one layout only ---------------------------------------
    ("07", "the DDP wrapper's inner module saved (no wrapper with 1 process)",
     [('return {"trainer": trainer, "model": model, "optimizer": optimizer}',
       'return {"trainer": trainer, "model": model.module, "optimizer": optimizer}')],
     r"on 1 process \(no process group\): rank 0 raised AttributeError: 'Sequential' object has no attribute "
     r"'module'"),
    ("07", "a barrier from torch.distributed before loading (raises with no process group)",
     [("    Checkpoint.load_objects(_objects(trainer, model, optimizer), read_checkpoint(checkpoint_file))",
       "    import torch.distributed as dist\n    dist.barrier()\n"
       "    Checkpoint.load_objects(_objects(trainer, model, optimizer), read_checkpoint(checkpoint_file))")],
     r"on 1 process \(no process group\): rank 0 raised ValueError: Default process group has not been initialized"),
    ("07", "only the local rank 0 of each node loads (rank 1 of 2 never loads either)",
     [("    Checkpoint.load_objects(_objects(trainer, model, optimizer), read_checkpoint(checkpoint_file))",
       "    if idist.get_local_rank() == 0:\n"
       "        Checkpoint.load_objects(_objects(trainer, model, optimizer), read_checkpoint(checkpoint_file))")],
     r"on 2 nodes x 2 processes: after resume rank 0 at iteration 7 .*rank 1 at iteration 0 .*EVERY rank must load"),
    ("07", "written on the last rank (which a single process does not have)",
     [("DiskSaver(dirname, require_empty=False, atomic=True)",
       "DiskSaver(dirname, require_empty=False, atomic=True, save_on_rank=1)")],
     r"on 1 process \(no process group\): on rank 0 the Checkpoint says it saved checkpoint_7.pt .*but there is "
     r"no such file: .*save_on_rank=1.*leave save_on_rank at its default"),
    ("07", "a folder per node (right on one node)",
     [("    checkpoint = Checkpoint(\n",
       "    import os\n    dirname = os.path.join(dirname, f\"node{idist.get_node_rank()}\")\n"
       "    checkpoint = Checkpoint(\n")],
     r"on 2 nodes x 2 processes: on rank 2 the Checkpoint says it saved node1/checkpoint_7.pt .*but there is no "
     r"such file: .*every rank names the same folder \(one every node sees\)"),
    # --- 10 sharded memory: wrong on one layout only ------------------------------------
    ("10", "a device mesh of the processes of one node (right on one node)", '''
def shard(model):
    import ignite.distributed as idist
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (idist.get_nproc_per_node(),))
    for layer in model.modules():
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model
''', r"on 2 nodes x 2 processes: rank \d raised \w+Error: .*in shard\n"),
    ("10", "FSDP shards by 2 however many ranks there are (right on 2)",
     [('shards = world_size if strategy == "fsdp" else 1', 'shards = min(world_size, 2) if strategy == "fsdp" else 1')],
     r"on 3 processes: under FSDP with 3 ranks you predicted \d+ bytes of params per rank; rank 0 holds \d+"
     r"|predict_bytes_per_rank\(\d+, 3, 'fsdp'\)"),
    ("10", "one process predicted as sharded in two",
     [('shards = world_size if strategy == "fsdp" else 1', 'shards = max(world_size, 2) if strategy == "fsdp" else 1')],
     r"predict_bytes_per_rank\(\d+, 1, 'fsdp'\)\['params'\] should be \d+, got \d+ .*with 1 process nothing "
     r"is divided"),
    ("10", "the world size of this run, not the one asked about", [
        ('shards = world_size if strategy == "fsdp" else 1',
         'import ignite.distributed as idist\n    shards = idist.get_world_size() if strategy == "fsdp" else 1')],
     r"predict_bytes_per_rank\(\d+, 2, 'fsdp'\)\['params'\] should be \d+, got \d+"
     r"|with 4 ranks under FSDP you predicted"),
    # --- 11 pipeline: 3 and 4 stages, several micro-batch counts ------------------------
    ("11", "no middle stage: every stage after the first is treated as the last", '''
def pipeline_step(stage_module, stage_index, num_stages, inputs, targets, n_microbatches):
    stage = PipelineStage(stage_module, stage_index, num_stages, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=n_microbatches, loss_fn=F.mse_loss)
    if stage_index == 0:
        schedule.step(inputs)
        return None
    losses = []
    schedule.step(target=targets, losses=losses)
    return torch.stack(losses).mean().item()
''', r"on 3 processes: with 3 stages and n_microbatches=3, stage 1 \(a middle stage, rank 1\) raised "
     r"RuntimeError: .*a middle stage gets neither inputs nor targets"),
    ("11", "the last stage is stage 1 (right with 2 stages)", '''
def pipeline_step(stage_module, stage_index, num_stages, inputs, targets, n_microbatches):
    stage = PipelineStage(stage_module, stage_index, num_stages, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=n_microbatches, loss_fn=F.mse_loss)
    if stage_index == 0:
        schedule.step(inputs)
        return None
    if stage_index != 1:
        schedule.step()
        return None
    losses = []
    schedule.step(target=targets, losses=losses)
    return torch.stack(losses).mean().item()
''', r"on 3 processes: with 3 stages and n_microbatches=3, stage \d \((a middle|the last) stage, rank \d\) raised"),
    ("11", "2 stages written in",
     [('PipelineStage(stage_module, stage_index, num_stages, torch.device("cpu"))',
       'PipelineStage(stage_module, stage_index, 2, torch.device("cpu"))')],
     r"on 3 processes: with 3 stages and n_microbatches=3, stage \d \(.*\) raised"),
    ("11", "the stage from the local rank (right on one node)",
     [('PipelineStage(stage_module, stage_index, num_stages, torch.device("cpu"))',
       'PipelineStage(stage_module, idist.get_local_rank(), num_stages, torch.device("cpu"))'),
      ("import torch\n", "import ignite.distributed as idist\nimport torch\n")],
     r"on 2 nodes x 2 processes|on 2 nodes x 2 processes \(4 stages, one per rank\)"),
    ("11", "as many micro-batches as stages (right when they are equal)",
     [("ScheduleGPipe(stage, n_microbatches=n_microbatches,", "ScheduleGPipe(stage, n_microbatches=num_stages,")],
     r"on 3 processes \(3 stages, one per rank\), n_microbatches=4: stage 0 \(the first stage, rank 0\) sent 3 "
     r"tensor\(s\) of shape \(4, 8\), not 4 of \(3, 8\)"),
    ("11", "the middle stages skip their step (only the ends run the schedule)", '''
def pipeline_step(stage_module, stage_index, num_stages, inputs, targets, n_microbatches):
    if 0 < stage_index < num_stages - 1:
        return None
    stage = PipelineStage(stage_module, stage_index, num_stages, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=n_microbatches, loss_fn=F.mse_loss)
    if stage_index == 0:
        schedule.step(inputs)
        return None
    losses = []
    schedule.step(target=targets, losses=losses)
    return torch.stack(losses).mean().item()
''', r"on 3 processes: .*(stage 1 \(a middle stage, rank 1\) sent 0 tensor|waited|still waiting|raised)"),
]
