"""Plausible wrong answers to exercises 08 (gradient accumulation), 02 (the training
function) and 03 (sharding), by issue 35's families, and the families of their older
answers in tests/test_exercises.py. Same format as ``WRONG_ANSWERS`` there: (exercise,
what the learner did, the change to the solution, what the learner must read); a change
is code appended to the solution (a later ``def`` wins) or (old, new) substitutions."""

# --- 08 gradient accumulation ------------------------------------------------------------
# The check runs 2 processes, 3, 2 nodes x 2, then 1 process with a plain model, each with
# 4, 1 and 3 micro-batches per process, on seeded random float32 inputs.
WRONG_ANSWERS_08 = [
    # layout: right in some layouts only
    ("08", "torch.distributed's world size in the scale (raises with no process group)", '''
def accumulation_step(model, optimizer, loss_fn, micro_batches):
    import torch.distributed as dist
    optimizer.zero_grad()
    # each sample weighs 1 / (the global batch); DDP then averages over the ranks: times the world size
    world = dist.get_world_size()
    total = world * sum(len(x) for x, _ in micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        context = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
        with context:
            (loss_fn(model(x), y) * len(x) * world / total).backward()
    optimizer.step()
''', r"on 1 process \(no process group\): rank 0 raised ValueError: Default process group has not been "
     r"initialized.*08_grad_accumulation.py"),
    ("08", "the inner module's forward before the last micro-batch (a plain model has no .module)", '''
def accumulation_step(model, optimizer, loss_fn, micro_batches):
    optimizer.zero_grad()
    n = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        # model.module skips DDP's forward: its backward is not exchanged
        forward = model if i == n - 1 else model.module
        (loss_fn(forward(x), y) / n).backward()
    optimizer.step()
''', r"on 1 process \(no process group\): rank 0 raised AttributeError: 'Linear' object has no attribute 'module'"),
    ("08", "the global batch counted with the processes of ONE node (right on one node)", '''
def accumulation_step(model, optimizer, loss_fn, micro_batches):
    optimizer.zero_grad()
    n = len(micro_batches)
    # my share of the global batch's mean, times the world size (DDP averages over it)
    share = idist.get_world_size() / (n * idist.get_nproc_per_node())
    for i, (x, y) in enumerate(micro_batches):
        last = i == n - 1
        context = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
        with context:
            (loss_fn(model(x), y) * share).backward()
    optimizer.step()
''', r"on 2 nodes x 2 processes, rank 0, 4 micro-batches per process: the weights after accumulated step 1 "
     r"differ .* The update is 2x the whole batch's.*DDP averages over the 4 process\(es\) itself"),
    ("08", "no_sync chosen by WORLD_SIZE from the environment (none without a launcher)", '''
def accumulation_step(model, optimizer, loss_fn, micro_batches):
    import os
    optimizer.zero_grad()
    n = len(micro_batches)
    distributed = int(os.environ["WORLD_SIZE"]) > 1
    for i, (x, y) in enumerate(micro_batches):
        context = model.no_sync() if distributed and i < n - 1 else contextlib.nullcontext()
        with context:
            (loss_fn(model(x), y) / n).backward()
    optimizer.step()
''', r"on 1 process \(no process group\): rank 0 raised KeyError: 'WORLD_SIZE'"),
    ("08", "divided by the world size, then doubled (right on 2 processes only)",
     [("loss = loss_fn(model(x), y) / n", "loss = loss_fn(model(x), y) / n / idist.get_world_size() * 2")],
     r"on 3 processes, rank 0, 4 micro-batches per process: .*The update is 0\.667x the whole batch's"),
    # structure: the right numbers, the wrong way
    ("08", "forwards outside no_sync, only the backwards inside (DDP decides at forward time)", '''
def accumulation_step(model, optimizer, loss_fn, micro_batches):
    optimizer.zero_grad()
    n = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        loss = loss_fn(model(x), y) / n
        if i < n - 1 and hasattr(model, "no_sync"):
            with model.no_sync():
                loss.backward()
        else:
            loss.backward()
    optimizer.step()
''', r"on 2 processes, rank 0, 4 micro-batches per process: DDP exchanged the gradients 4 times per call "
     r"for 4 micro-batches: no_sync\(\) was entered 3 time\(s\), but no forward ran inside it: DDP decides at "
     r"FORWARD time"),
    ("08", "the FIRST micro-batch outside no_sync, the others inside (exchanged too early)",
     [("        if last or not hasattr(model, \"no_sync\"):", "        if i == 0 or not hasattr(model, \"no_sync\"):")],
     r"on 2 processes, 4 micro-batches per process: after the steps, rank 1 and rank 0 hold different weights "
     r".*DDP exchanged them once per call, but not the sum of all the micro-batches.*Make that micro-batch "
     r"the LAST one"),
    ("08", "the next micro-batch's forward before this one's backward (two held at once)", '''
def accumulation_step(model, optimizer, loss_fn, micro_batches):
    optimizer.zero_grad()
    n = len(micro_batches)
    quiet = model.no_sync if hasattr(model, "no_sync") else contextlib.nullcontext
    pending = None
    for x, y in micro_batches[:-1]:
        with quiet():
            loss = loss_fn(model(x), y) / n  # start the next forward before the last backward
            if pending is not None:
                pending.backward()
        pending = loss
    if pending is not None:
        with quiet():
            pending.backward()
    x, y = micro_batches[-1]
    (loss_fn(model(x), y) / n).backward()
    optimizer.step()
''', r"on 2 processes, rank 0, 4 micro-batches per process: accumulation_step held the activations of 2 "
     r"micro-batches at once"),
    ("08", "the loss all-reduced every micro-batch, for the log", '''
def accumulation_step(model, optimizer, loss_fn, micro_batches):
    optimizer.zero_grad()
    n = len(micro_batches)
    total = 0.0
    for i, (x, y) in enumerate(micro_batches):
        last = i == n - 1
        context = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
        with context:
            loss = loss_fn(model(x), y) / n
            loss.backward()
        total += idist.all_reduce(loss.item()) / idist.get_world_size()
    optimizer.step()
    return total
''', r"on 2 processes, rank 0, 4 micro-batches per process: made 4 torch.distributed call\(s\) of its own in one "
     r"call of accumulation_step \(all_reduce\), on tensors of shape\(s\) \(\), beside DDP's 1 exchange\(s\).*the "
     r"step needs no collective but DDP's exchange"),
    ("08", "a barrier after the step, to keep the replicas together",
     [("    optimizer.step()\n", "    optimizer.step()\n    torch.distributed.barrier()\n")],
     r"on 2 processes, rank 0, 4 micro-batches per process: made 1 torch.distributed call\(s\) of its own .*"
     r"\(barrier\), on tensors of shape\(s\) none"),
    # inputs: right on benign inputs only
    ("08", "the micro-batch count written in (4, the docstring's example)",
     [("loss = loss_fn(model(x), y) / n", "loss = loss_fn(model(x), y) / 4")],
     r"on 2 processes, rank 0, 1 micro-batch per process: the weights after accumulated step 1 differ .*The "
     r"update is 0\.25x the whole batch's.*not a number written in"),
    ("08", "the last micro-batch's index written in (3)",
     [("last = i == n - 1", "last = i == 3")],
     r"on 2 processes, 1 micro-batch per process: after the steps, rank 1 and rank 0 hold different weights "
     r".*the gradients were never exchanged"),
    ("08", "the scale 1/n kept in bfloat16 (exact for 1, 2, 4 micro-batches)",
     [("loss = loss_fn(model(x), y) / n", "loss = loss_fn(model(x), y) * torch.tensor(1 / n, dtype=torch.bfloat16)")],
     r"on 2 processes, rank 0, 3 micro-batches per process: the weights after accumulated step 1 differ .*"
     r"about what rounding to bfloat16 \(about 4e-3\) or float16"),
    ("08", "the loss in float16 before the division (exact for 1, 2, 4 micro-batches)",
     [("loss = loss_fn(model(x), y) / n", "loss = loss_fn(model(x), y).half() / n")],
     r"on 2 processes, rank 0, 3 micro-batches per process: the weights after accumulated step 1 differ .*"
     r"keep every value in float32"),
    ("08", "autocast to bfloat16 around the forward, to save activation memory",
     [("            loss = loss_fn(model(x), y) / n\n",
       "            with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):\n"
       "                loss = loss_fn(model(x), y) / n\n")],
     r"on 2 processes, rank 0, 4 micro-batches per process: the weights after accumulated step 1 differ .*"
     r"about what rounding to bfloat16"),
    ("08", "the output and targets cast to bfloat16 for the loss",
     [("loss = loss_fn(model(x), y) / n", "loss = loss_fn(model(x).bfloat16(), y.bfloat16()) / n")],
     r"on 2 processes, rank 0, 4 micro-batches per process: the weights after accumulated step 1 differ .*"
     r"about what rounding to bfloat16"),
    # device: a GPU named (raises here; on a GPU machine the wrong one when it is not idist.device())
    ("08", "the micro-batches moved with .cuda()",
     [("            loss = loss_fn(model(x), y) / n", "            x, y = x.cuda(), y.cuda()\n            loss = loss_fn(model(x), y) / n")],
     r"on 2 processes: rank 0 raised RuntimeError: Found no NVIDIA driver.*a tensor or module was put on a GPU "
     r"by name.*Use idist.device\(\)"),
    ("08", "the micro-batches moved to cuda:RANK",
     [("            loss = loss_fn(model(x), y) / n",
       "            device = torch.device(f\"cuda:{idist.get_rank()}\")\n"
       "            loss = loss_fn(model(x.to(device)), y.to(device)) / n")],
     r"on 2 processes: rank 0 raised RuntimeError: Found no NVIDIA driver.*Use idist.device\(\)"),
    ("08", "torch.cuda.set_device(local rank) at the start",
     [("    optimizer.zero_grad()\n", "    torch.cuda.set_device(idist.get_local_rank())\n    optimizer.zero_grad()\n")],
     r"on 2 processes: rank 0 raised RuntimeError: Found no NVIDIA driver"),
    ("08", "the model moved to 'cuda' in the step",
     [("    optimizer.zero_grad()\n", "    model.to(\"cuda\")\n    optimizer.zero_grad()\n")],
     r"on 2 processes: rank 0 raised RuntimeError: Found no NVIDIA driver.*08_grad_accumulation.py"),
    ("08", "the scale made a tensor on 'cuda'",
     [("loss = loss_fn(model(x), y) / n", "loss = loss_fn(model(x), y) / torch.tensor(float(n), device=\"cuda\")")],
     r"on 2 processes: rank 0 raised RuntimeError: Found no NVIDIA driver"),
    ("08", "torch.cuda.synchronize() before the step",
     [("    optimizer.step()\n", "    torch.cuda.synchronize()  # wait for the GPU before stepping\n    optimizer.step()\n")],
     r"on 2 processes: rank 0 raised RuntimeError: Found no NVIDIA driver"),
    # robust: the check survives and says what the answer did
    ("08", "never steps: the loss returned for the caller to step",
     [("    optimizer.step()\n", "    return loss\n")],
     r"on 2 processes, rank 0, 4 micro-batches per process: optimizer.step\(\) ran 0 times in one call"),
    ("08", "a step after the last backward, and another after the loop",
     [("            loss.backward()\n", "            loss.backward()\n            if last:\n                optimizer.step()\n")],
     r"optimizer.step\(\) ran 2 times in one call"),
    ("08", "enumerate's index taken for the input",
     [("    for i, (x, y) in enumerate(micro_batches):\n        last = i == n - 1\n",
       "    for x, y in enumerate(micro_batches):\n        last = x == n - 1\n")],
     r"on 2 processes: rank [01] raised TypeError: .*must be Tensor, not int.*08_grad_accumulation.py"),
    ("08", "torch.no_grad() for the micro-batches before the last (no sync = no gradients)",
     [("context = model.no_sync()", "context = torch.no_grad()")],
     r"on 2 processes: rank [01] raised RuntimeError: element 0 of tensors does not require grad"),
    ("08", "the mean of the earlier micro-batches' losses printed (fails with one micro-batch)", '''
def accumulation_step(model, optimizer, loss_fn, micro_batches):
    optimizer.zero_grad()
    n = len(micro_batches)
    losses = []
    for i, (x, y) in enumerate(micro_batches):
        last = i == n - 1
        context = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
        with context:
            loss = loss_fn(model(x), y) / n
            loss.backward()
        losses.append(loss.item() * n)
    optimizer.step()
    print(f"last micro-batch {losses[-1]:.4f}, the earlier ones {sum(losses[:-1]) / len(losses[:-1]):.4f}")
''', r"on 2 processes: rank [01] raised ZeroDivisionError: division by zero"),
    # understanding
    ("08", "zero_grad before every micro-batch (only the last one counts)",
     [("        last = i == n - 1\n", "        last = i == n - 1\n        optimizer.zero_grad()\n")],
     r"on 2 processes, rank 0, 4 micro-batches per process: .*Only the LAST micro-batch of each process "
     r"counted"),
]

WRONG_ANSWERS = WRONG_ANSWERS_08

# --- 03 sharding -------------------------------------------------------------------------
# The reference comparison runs 22 samples in global batches of 10 (neither divides by 3 or
# 4 processes; on 2 processes each rank's 11 samples end in a partial batch).
WRONG_ANSWERS_03 = [
    # layout
    ("03", "the rank read from the environment (none without a launcher)",
     [("rank=idist.get_rank()", 'rank=int(__import__("os").environ["RANK"])')],
     r"on 1 process \(no process group\): rank 0 raised KeyError: 'RANK'"),
    ("03", "torch.distributed's world size for num_replicas (raises with no process group)",
     [("    world_size = idist.get_world_size()\n",
       "    import torch.distributed as dist\n    world_size = dist.get_world_size()\n")],
     r"on 1 process \(no process group\): rank 0 raised ValueError: Default process group has not been "
     r"initialized.*03_sharding.py"),
    ("03", "the batch per process written for 2 processes",
     [("batch_size=global_batch_size // world_size", "batch_size=global_batch_size // 2")],
     r"on 2 nodes of 2 processes each .*rank 0 got batches of 4 samples: the GLOBAL batch of 8 divided by 2, "
     r"not by the world size 4"),
    # inputs: sizes that do not divide
    ("03", "the loader drops the last partial batch (drop_last=True)",
     [("sampler=sampler)", "sampler=sampler, drop_last=True)")],
     r"on 2 processes, rank 0, 22 samples \(not a multiple of the world size\): the indices read in epoch 0 "
     r"should have 11 items, got 10"),
    ("03", "the indices cut to len(dataset) // world size (the padding dropped)",
     [("    return [int(i) for _, _, index in loader for i in index]",
       "    indices = [int(i) for _, _, index in loader for i in index]\n"
       "    return indices[:len(loader.dataset) // idist.get_world_size()]")],
     r"on 3 processes, rank 0, 22 samples \(not a multiple of the world size\): the indices read in epoch 0 "
     r"should have 8 items, got 7"),
    ("03", "the batch per process rounded up",
     [("batch_size=global_batch_size // world_size", "batch_size=-(-global_batch_size // world_size)")],
     r"on 3 processes, rank 0, 22 samples in global batches of 10: the batch sizes should have 3 items, got 2; "
     r"expected 3, 3, 2, got 4, 4 \(global_batch_size // world size per batch, rounded down"),
    ("03", "only full batches counted",
     [("    return [int(i) for _, _, index in loader for i in index]",
       "    return [int(i) for _, _, index in loader if len(index) == loader.batch_size for i in index]")],
     r"on 2 processes, rank 0, 22 samples \(not a multiple of the world size\): the indices read in epoch 0 "
     r"should have 11 items, got 10"),
    ("03", "torch.stack of the batches' indices (needs equal batches)",
     [("    return [int(i) for _, _, index in loader for i in index]",
       "    import torch\n    return torch.stack([index for _, _, index in loader]).flatten().tolist()")],
     r"on 2 processes: rank [01] raised RuntimeError: stack expects each tensor to be equal size"),
    # robust
    ("03", "the batch per process with / (a float)",
     [("batch_size=global_batch_size // world_size", "batch_size=global_batch_size / world_size")],
     r"rank [01] raised ValueError: batch_size should be a positive integer value, but got batch_size=2\.0"),
    ("03", "epoch_indices returns one tensor",
     [("    return [int(i) for _, _, index in loader for i in index]",
       "    import torch\n    return torch.cat([index for _, _, index in loader])")],
     r"epoch_indices\(loader, 0\) returned a int64 tensor of shape \(10,\): return a flat list of Python ints"),
    ("03", "epoch_indices returns a list per batch",
     [("    return [int(i) for _, _, index in loader for i in index]",
       "    return [index.tolist() for _, _, index in loader]")],
     r"epoch_indices\(loader, 0\) returned a list of 5 of a list of 2: return a flat list of Python ints"),
    ("03", "make_train_loader never returns the loader",
     [("    return DataLoader(dataset, batch_size=global_batch_size // world_size, sampler=sampler)",
       "    loader = DataLoader(dataset, batch_size=global_batch_size // world_size, sampler=sampler)")],
     r"make_train_loader returned None: return the DataLoader"),
    ("03", "make_train_loader returns the sampler",
     [("    return DataLoader(dataset, batch_size=global_batch_size // world_size, sampler=sampler)",
       "    return sampler")],
     r"make_train_loader returned <torch.utils.data.distributed.DistributedSampler object.*: return the "
     r"DataLoader"),
    ("03", "set_epoch called on the DataLoader",
     [("    loader.sampler.set_epoch(epoch)", "    loader.set_epoch(epoch)")],
     r"rank [01] raised AttributeError: 'DataLoader' object has no attribute 'set_epoch'"),
]
WRONG_ANSWERS += WRONG_ANSWERS_03
