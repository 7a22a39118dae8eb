"""Plausible wrong answers to exercises 08 (gradient accumulation), 02 (the training
function) and 03 (sharding), by issue 35's families, and the families of their older
answers in tests/exercises/test_exercises.py. Same format as ``WRONG_ANSWERS`` there: (exercise,
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
    ("08", "one no_sync() made before the loop and entered at every micro-batch", '''
def accumulation_step(model, optimizer, loss_fn, micro_batches):
    optimizer.zero_grad()
    n = len(micro_batches)
    quiet = model.no_sync() if hasattr(model, "no_sync") else contextlib.nullcontext()
    for i, (x, y) in enumerate(micro_batches):
        with contextlib.nullcontext() if i == n - 1 else quiet:
            (loss_fn(model(x), y) / n).backward()
    optimizer.step()
''', r"a no_sync\(\) context was entered twice: no_sync\(\) is a context manager, and each one can be "
     r"entered only once\. Use a new one per micro-batch"),
]

WRONG_ANSWERS = list(WRONG_ANSWERS_08)

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

# --- 02 training function ------------------------------------------------------------------
_LOADER_02 = ('    train_loader = idist.auto_dataloader(\n        config["dataset"], batch_size=config["batch_size"], '
              'shuffle=True)\n')
WRONG_ANSWERS_02 = [
    # layout
    ("02", "set_epoch without asking whether the sampler has it (one process has none)",
     [('        if hasattr(train_loader.sampler, "set_epoch"):\n            train_loader.sampler.set_epoch(engine.state.epoch - 1)\n',
       "        train_loader.sampler.set_epoch(engine.state.epoch - 1)\n")],
     r"on 1 process \(no process group\): rank 0 raised AttributeError: 'RandomSampler' object has no attribute "
     r"'set_epoch'"),
    ("02", "the optimizer on model.module's parameters (a plain model has no .module)",
     [('torch.optim.SGD(model.parameters(), lr=config["lr"])', 'torch.optim.SGD(model.module.parameters(), lr=config["lr"])')],
     r"on 1 process \(no process group\): rank 0 raised AttributeError: 'Sequential' object has no attribute 'module'"),
    ("02", "a loader by hand, the batch divided by the processes of one node",
     [(_LOADER_02,
       "    from torch.utils.data import DataLoader, DistributedSampler\n"
       '    sampler = DistributedSampler(config["dataset"], num_replicas=idist.get_world_size(), rank=idist.get_rank(), shuffle=True)\n'
       '    train_loader = DataLoader(config["dataset"], batch_size=config["batch_size"] // idist.get_nproc_per_node(), sampler=sampler)\n')],
     r"on 2 nodes x 2 processes, rank 0's loader takes 8 samples per step, but a GLOBAL batch of 16 over 4 processes "
     r"is 4 each"),
    ("02", "a loader by hand, num_replicas from the processes of one node",
     [(_LOADER_02,
       "    from torch.utils.data import DataLoader, DistributedSampler\n"
       '    sampler = DistributedSampler(config["dataset"], num_replicas=idist.get_nproc_per_node(), rank=idist.get_rank(), shuffle=True)\n'
       '    train_loader = DataLoader(config["dataset"], batch_size=config["batch_size"] // idist.get_world_size(), sampler=sampler)\n')],
     r"on 2 nodes x 2 processes: rank [23] raised ValueError: Invalid rank [23], rank should be in the interval"),
    ("02", "the batch checked with torch.distributed's world size (raises with no process group)",
     [("    train_loader = idist.auto_dataloader(\n",
       '    assert config["batch_size"] % torch.distributed.get_world_size() == 0, "the batch must divide"\n'
       "    train_loader = idist.auto_dataloader(\n")],
     r"on 1 process \(no process group\): rank 0 raised ValueError: Default process group has not been initialized"),
    ("02", "set_epoch only if WORLD_SIZE (from the environment) is above 1",
     [('        if hasattr(train_loader.sampler, "set_epoch"):', '        if int(__import__("os").environ["WORLD_SIZE"]) > 1:')],
     r"on 1 process \(no process group\): rank 0 raised KeyError: 'WORLD_SIZE'"),
    # inputs: a dataset that does not divide by the world size (64 samples on 3 processes)
    ("02", "drop_last=True, as in ignite's own auto_dataloader example",
     [('batch_size=config["batch_size"], shuffle=True)', 'batch_size=config["batch_size"], shuffle=True, drop_last=True)')],
     r"on 3 processes, 64 samples \(not a multiple of 3\), global batches of 24: rank 0 read 48 samples in 3 "
     r"epochs, but each rank should read 22 per epoch.*no drop_last=True"),
    ("02", "the iterations per epoch from the dataset's size, rounded down",
     [('max_epochs=config["epochs"]', 'max_epochs=config["epochs"], epoch_length=len(config["dataset"]) // config["batch_size"]')],
     r"on 3 processes, 64 samples .*: rank 0 read 44 samples in 3 epochs, but each rank should read 22 per epoch"),
    ("02", "the iterations per epoch from the sampler's share, rounded down",
     [('max_epochs=config["epochs"]',
       'max_epochs=config["epochs"],\n                epoch_length=len(train_loader.sampler) // train_loader.batch_size')],
     r"on 3 processes, 64 samples .*: rank 0 read 44 samples in 3 epochs, but each rank should read 22 per epoch"),
    ("02", "a DistributedSampler by hand with drop_last=True",
     [(_LOADER_02,
       "    from torch.utils.data import DataLoader, DistributedSampler\n"
       '    sampler = DistributedSampler(config["dataset"], num_replicas=idist.get_world_size(), rank=idist.get_rank(),\n'
       "                                 shuffle=True, drop_last=True)\n"
       '    train_loader = DataLoader(config["dataset"], batch_size=config["batch_size"] // idist.get_world_size(), sampler=sampler)\n')],
     r"on 3 processes, 64 samples .*: rank 0 read 63 samples in 3 epochs, but each rank should read 22 per epoch"),
    ("02", "a loader by hand that drops its last partial batch",
     [(_LOADER_02,
       "    from torch.utils.data import DataLoader, DistributedSampler\n"
       '    sampler = DistributedSampler(config["dataset"], num_replicas=idist.get_world_size(), rank=idist.get_rank(), shuffle=True)\n'
       '    train_loader = DataLoader(config["dataset"], batch_size=config["batch_size"] // idist.get_world_size(),\n'
       "                              sampler=sampler, drop_last=True)\n")],
     r"on 3 processes, 64 samples .*: rank 0 read 48 samples in 3 epochs, but each rank should read 22 per epoch"),
    ("02", "the dataset trimmed to a multiple of the world size (to avoid padding)",
     [(_LOADER_02,
       '    dataset = config["dataset"]\n'
       "    dataset = torch.utils.data.Subset(dataset, range(len(dataset) - len(dataset) % idist.get_world_size()))\n"
       '    train_loader = idist.auto_dataloader(dataset, batch_size=config["batch_size"], shuffle=True)\n')],
     r"on 3 processes, 64 samples .*: rank 0 read 63 samples in 3 epochs, but each rank should read 22 per epoch"),
    # robust
    ("02", "the model returned alone", [("    return model, train_loader", "    return model")],
     r"training returned the model alone \(a DistributedDataParallel\): return the pair \(model, train_loader\)"),
    ("02", "the pair returned the other way round", [("    return model, train_loader", "    return train_loader, model")],
     r"training returned \(train_loader, model\): return them in the order the task asks"),
    ("02", "nothing returned", [("    return model, train_loader", "    pass")],
     r"training returned None: return the pair \(model, train_loader\)"),
    ("02", "the trainer returned", [("    return model, train_loader", "    return trainer")],
     r"training returned <ignite.engine.engine.Engine object at .*>: return the pair \(model, train_loader\)"),
    ("02", "the trainer returned too", [("    return model, train_loader", "    return model, train_loader, trainer")],
     r"training returned a tuple of 3: return the pair \(model, train_loader\)"),
    ("02", "a config key misspelled", [('max_epochs=config["epochs"]', 'max_epochs=config["epoch"]')],
     r"rank [01] raised KeyError: 'epoch'.*02_training_function.py"),
]
WRONG_ANSWERS += WRONG_ANSWERS_02

# --- families (tests/wrong_answer_families.py) ----------------------------------------------
_OLD = {
    "08": {"no no_sync: one exchange per micro-batch": "structure",
           "the micro-batch losses are not scaled": "understanding",
           "the loss divided by the world size too": "understanding",
           "a step after every micro-batch": "robust",
           "the gradients are never zeroed": "understanding",
           "no_sync on a plain model": "layout",
           "every backward inside no_sync: never exchanged": "structure",
           "every backward inside no_sync, then an all_reduce per parameter": "structure",
           "torch.distributed.all_reduce per parameter after no_sync": "structure",
           "DDP's exchange and a manual one on top": "structure",
           "one flat all_reduce by hand": "structure",
           "every forward first, one backward of the summed losses (right weights, all activations held)": "structure"},
    "02": {"a plain DataLoader: every rank reads everything": "understanding",
           "no auto_model: the replicas drift apart": "understanding",
           "no set_epoch: every epoch in the same order": "understanding",
           "the batch size divided by hand": "understanding",
           "no auto_optim": "understanding",
           "auto_optim's result dropped": "understanding",
           "another optimizer given to the trainer": "understanding",
           "a sampler that never shuffles": "understanding",
           "the batch size multiplied by the world size": "understanding",
           "auto_optim applied after the trainer was built": "understanding",
           "auto_optim wraps a second optimizer": "understanding",
           "the learning rate scaled by the world size (exercise 06's rule)": "understanding",
           "the loss summed over the batch": "understanding",
           "torch.distributed's barrier at the start (raises with no process group)": "layout"},
    "03": {"the same shuffled DataLoader on every rank": "understanding",
           "a DistributedSampler without set_epoch": "understanding",
           "a different seed on each rank": "understanding",
           "the seed ignored": "understanding",
           "the GLOBAL batch on every rank": "understanding",
           "num_replicas from the processes of one node": "layout",
           "the local rank for the shard": "layout",
           "the batch divided by the processes of one node": "layout",
           "a fixed strided Subset, shuffled by the loader": "understanding",
           "a contiguous block per rank, shuffled by the loader": "understanding",
           "one permutation dealt out once, reshuffled within each shard": "understanding",
           "a DistributedSampler's shard taken once, shuffled by the loader": "understanding",
           "a DistributedSampler that never shuffles": "understanding",
           "DistributedSampler's defaults (raises with no process group)": "layout",
           "the last samples dropped (drop_last=True)": "inputs"},
}
_SECTIONS = {  # the new answers: their family, by the comment they are listed under
    "08": [("layout", 5), ("structure", 5), ("inputs", 6), ("device", 6), ("robust", 5), ("understanding", 2)],
    "03": [("layout", 3), ("inputs", 5), ("robust", 6)],
    "02": [("layout", 6), ("inputs", 6), ("robust", 6)],
}


def _families():
    family = {(n, name): tag for n, names in _OLD.items() for name, tag in names.items()}
    for number, answers in (("08", WRONG_ANSWERS_08), ("03", WRONG_ANSWERS_03), ("02", WRONG_ANSWERS_02)):
        tags = [tag for tag, count in _SECTIONS[number] for _ in range(count)]
        assert len(tags) == len(answers), f"{number}: {len(tags)} tags for {len(answers)} answers"
        family.update({(number, answer[1]): tag for answer, tag in zip(answers, tags)})
    return family


FAMILY = _families()
APPLIES = {"08": ("layout", "inputs", "structure", "device", "robust"),
           "03": ("layout", "inputs", "robust"),
           "02": ("layout", "inputs", "robust")}
NOT_APPLICABLE = {
    ("03", "structure"): "the task is which samples each rank reads, in which order; nothing of it is about "
                         "performance (no overlap, no memory held, no choice of operations): the indices ARE "
                         "the behaviour, compared with the reference's exactly",
    ("03", "device"): "no tensor goes to a device or a collective: the loader yields CPU batches and the "
                      "answer returns Python ints; there is no device to name",
    ("02", "structure"): "the structure (DDP's exchange, the sampler's sharding) is ignite's, through the "
                         "three auto_* calls; the learner chooses no operation, overlap or memory layout",
    ("02", "device"): "the only device is the trainer's, create_supervised_trainer(..., device=idist.device()): "
                      "on this CPU-only machine 'cpu' and idist.device() are the same device, and 'cuda' raises "
                      "(the harness then says to use idist.device()); no collective gets a tensor from the "
                      "learner's code. A trainer given no device is named (the check records the device "
                      "create_supervised_trainer gets); device='cuda:RANK' is not checked",
}
