"""Exercises 01, 04, 05, 06 and 07 (issue 35): the family of every wrong answer of theirs,
which families apply to each, and new plausible wrong answers, in the format of
``WRONG_ANSWERS`` in test_exercises.py (which grades them with the others):
(exercise, what the learner did, the change to the solution, what the learner must read).

A family that does not apply says why (``NOT_APPLICABLE``); see
tests/wrong_answer_families.py for the families and ``python tests/wrong_answer_families.py
01 04 05 06 07`` for what is still missing.
"""

# --- which families apply ---------------------------------------------------------------
APPLIES = {
    "01": ("layout", "inputs", "device", "robust"),
    "04": ("layout", "structure", "robust"),
    "05": ("layout", "inputs", "device", "robust"),
    "06": ("layout", "inputs", "robust"),
    "07": ("layout", "robust"),
}
NOT_APPLICABLE = {
    ("01", "structure"): "the lesson is the number every rank ends with, not how it is reached: any "
                         "collective that hands every rank the mean (all_gather and a sum, too) is a right "
                         "answer, so there is no wrong way to the right number to reject",
    ("04", "inputs"): "the only input is a folder: the check gives every layout fresh folders (one per node "
                      "on 2 x 2) and calls twice, once with the dataset absent and once present; there is no "
                      "value whose size or precision could hide a shortcut",
    ("04", "device"): "no tensor goes to a collective and no device is chosen: load() returns the bytes on "
                      "the CPU, and the only collective is one_rank_first's barrier, which takes no tensor",
    ("05", "structure"): "the events a Timer is attached to are checked through the number it measures (the "
                         "check knows each step's, fetch's and handler's own time), and the slowest rank "
                         "reached by another collective (all_gather, then max) is a right answer",
    ("06", "structure"): "the answer is the schedule itself: any ignite scheduler that sets the same "
                         "learning rate at every iteration is right, however it is built",
    ("06", "device"): "no tensor and no collective: the answer only reads idist.get_world_size()",
    ("07", "inputs"): "the inputs are fixed training objects and the check compares the resumed run's "
                      "weights exactly with an uninterrupted run's; the answer computes nothing on values "
                      "that could be benign or not (the one choice, stopping at an odd iteration, is "
                      "there for the checkpoint period, a mistake of understanding)",
    ("07", "structure"): "the structure is the result here: which files exist, which iteration each holds, "
                         "who wrote them and what a resumed run ends with are what the check observes",
    ("07", "device"): "the answer chooses no device: the given read_checkpoint loads onto the CPU and "
                      "Checkpoint.load_objects copies into each rank's own parameters, wherever they live; "
                      "no tensor of the answer goes to a collective",
}

# --- the family of every wrong answer (old ones included, wherever they are listed) -------
FAMILY = {
    # 01, test_exercises.py
    ("01", "reduce to rank 0 only"): "understanding",
    ("01", "the sum, not the mean"): "understanding",
    ("01", "a hard-coded divisor of 2"): "layout",
    ("01", "a tensor returned"): "robust",
    ("01", "its own value, nothing combined"): "understanding",
    ("01", "divided by the processes of one node"): "layout",
    ("01", "only rank 0 divides"): "understanding",
    ("01", "rank 0's value broadcast"): "understanding",
    ("01", "all_reduce with op MAX"): "understanding",
    ("01", "all_reduce with op MIN, not divided"): "understanding",
    ("01", "only rank 0 runs the all_reduce"): "robust",
    # 01, wrong_answers_layouts.py
    ("01", "torch.distributed's world size (raises with no process group)"): "layout",
    ("01", "the world size read from the environment (none without a launcher)"): "layout",
    ("01", "a bare dist.all_reduce on a tensor (raises with no process group)"): "layout",
    ("01", "divided by LOCAL_WORLD_SIZE from the environment (right on one node)"): "layout",
    ("01", "all_gather, then the mean of this node's ranks (right on one node)"): "layout",
    ("01", "the mean of my value and the other rank's (right on 2 processes)"): "layout",
    ("01", "a bfloat16 all_reduce (the fixed values are exact in bfloat16)"): "inputs",
    ("01", "a float16 all_reduce"): "inputs",
    ("01", "the values taken as whole numbers (int)"): "inputs",
    ("01", "the mean rounded to 2 decimals for the log"): "inputs",
    ("01", "the absolute values averaged (a loss is never negative... other numbers are)"): "inputs",
    ("01", "the values summed in float32, then the mean in float16 for the log"): "inputs",
    ("01", "a tensor put on 'cuda' by name"): "device",
    ("01", "the device chosen by global rank (cuda:RANK)"): "device",
    ("01", "torch.cuda.set_device(global rank) first"): "device",
    ("01", "the tensor moved with .cuda()"): "device",
    ("01", "torch.device('cuda', local rank) (right on a GPU node, not on a CPU)"): "device",
    # 04, test_exercises.py
    ("04", "rank 0 downloads, the others do not wait"): "understanding",
    ("04", "every process downloads"): "structure",
    ("04", "one_rank_first, but every process downloads in turn"): "structure",
    ("04", "a download on every call"): "structure",
    ("04", "a barrier that only the downloading rank reaches"): "robust",
    ("04", "one_rank_first for the whole run (right on one node, wrong with a disk per node)"): "layout",
    ("04", "only rank 0 of the whole run downloads (right on one node)"): "layout",
    ("04", "torch.distributed's barrier (raises with no process group)"): "layout",
    ("04", "the bytes returned as a list"): "robust",
    # 05, test_exercises.py
    ("05", "a Timer that also counts fetching the batch"): "understanding",
    ("05", "a total, not an average"): "understanding",
    ("05", "a Timer paused only when the next batch is fetched"): "understanding",
    ("05", "each rank keeps its own time"): "understanding",
    ("05", "the sum of the times"): "understanding",
    ("05", "a tensor returned"): "robust",
    ("05", "the old reference: a Timer that runs from EPOCH_STARTED"): "understanding",
    ("05", "started once at STARTED and never paused"): "understanding",
    ("05", "a timer that keeps only the last step"): "inputs",  # right if every step took as long
    ("05", "a reduce to rank 0"): "understanding",
    ("05", "the smallest time"): "understanding",
    ("05", "the mean of the times"): "understanding",
    ("05", "rank 0's time broadcast"): "understanding",
    ("05", "torch.distributed's all_reduce (raises with no process group)"): "layout",
    ("05", "the largest of the first two ranks only (right on 2 processes)"): "layout",
    # 06, test_exercises.py
    ("06", "no linear scaling"): "understanding",
    ("06", "no warm-up"): "understanding",
    ("06", "the world size hard-coded"): "layout",
    ("06", "no decay"): "understanding",
    ("06", "scaled by the processes of one node"): "layout",
    ("06", "scaled by the number of nodes"): "layout",
    # 06, wrong_answers_layouts.py
    ("06", "torch.distributed's world size (raises with no process group)"): "layout",
    ("06", "the world size read from the environment"): "layout",
    ("06", "scaled by LOCAL_WORLD_SIZE from the environment (right on one node)"): "layout",
    ("06", "scaled by the GPUs of this machine (none here)"): "layout",
    ("06", "scaled by the rank + 1 (a rank is not a count)"): "understanding",
    ("06", "the square-root scaling rule"): "understanding",
    ("06", "the warm-up of the example (4 steps) written in"): "inputs",
    ("06", "the length of the example (12 steps) written in"): "inputs",
    ("06", "the example's base_lr (0.1) written in"): "inputs",
    ("06", "the peak rounded to 2 decimals"): "inputs",
    ("06", "the warm-up as a fixed third of the run (4 of 12 in the example)"): "inputs",
    ("06", "the decay to base_lr / 10 at the end (ends at 0 only if ... never)"): "understanding",
    # 07, test_exercises.py
    ("07", "only rank 0 loads the checkpoint"): "understanding",
    ("07", "the optimizer is not saved"): "understanding",
    ("07", "how many files to keep ignored"): "understanding",
    ("07", "a folder that must be empty"): "understanding",
    ("07", "a checkpoint per epoch"): "understanding",
    ("07", "only rank 0 creates the Checkpoint"): "robust",
    ("07", "a global_step_transform with one argument"): "robust",
    ("07", "a checkpoint every 2 iterations"): "understanding",
    ("07", "a checkpoint when the iteration starts"): "understanding",
    ("07", "a checkpoint when the run completes"): "understanding",
    ("07", "every rank writes the checkpoint files"): "understanding",
    ("07", "only the model is loaded"): "understanding",
    ("07", "the state dicts loaded by hand into the DDP model"): "robust",
    # 07, wrong_answers_layouts.py
    ("07", "the DDP wrapper's inner module saved (no wrapper with 1 process)"): "layout",
    ("07", "a barrier from torch.distributed before loading (raises with no process group)"): "layout",
    ("07", "only the local rank 0 of each node loads (rank 1 of 2 never loads either)"): "layout",
    ("07", "written on the last rank (which a single process does not have)"): "layout",
    ("07", "a folder per node (right on one node)"): "layout",
}

TORCH = ("import ignite.distributed as idist", "import ignite.distributed as idist\nimport torch")

WRONG_ANSWERS = [
    # === 01 collectives ==================================================================
    ("01", "a tensor on torch.cuda.current_device() (a GPU machine's habit)",
     [("total = idist.all_reduce(float(value))",
       "total = idist.all_reduce(torch.tensor(float(value), device=torch.cuda.current_device())).item()"),
      TORCH],
     r"rank 0 raised RuntimeError: Found no NVIDIA driver.*put on a GPU by name.*Use idist.device\(\)"),
    ("01", "the mean printed, not returned",
     [("    return total / idist.get_world_size()", "    print(total / idist.get_world_size())")],
     r"rank 0 returned None \(NoneType\); return a Python float"),
    ("01", "all_gather's list returned (every value, not their mean)",
     [("    total = idist.all_reduce(float(value))\n", "    return idist.all_gather(float(value))\n")],
     r"rank 0 returned \[1\.0, 4\.0\] \(a list of 2\); return a Python float"),
    ("01", "the mean formatted as a string for the log",
     [("return total / idist.get_world_size()", 'return f"{total / idist.get_world_size():.4f}"')],
     r"rank 0 returned '2\.5000' \(str\); return a Python float"),
    ("01", "the value taken for a tensor (value.clone())",
     [("idist.all_reduce(float(value))", "idist.all_reduce(value.clone()).item()")],
     r"rank 0 raised AttributeError: 'float' object has no attribute 'clone'.*01_collectives.py\", line \d+, "
     r"in average_across_ranks"),
    ("01", "the mean and the world size returned together",
     [("return total / idist.get_world_size()",
       "return total / idist.get_world_size(), idist.get_world_size()")],
     r"rank 0 returned \(2\.5, 2\) \(a tuple of 2\); return a Python float"),

    # === 04 safe download ================================================================
    # layout
    ("04", "local rank 0 computed as rank % 2 (nodes of 2 GPUs)", '''
def get_dataset(root):
    if idist.get_rank() % 2 == 0 and not is_downloaded(root):
        download(root)
    idist.barrier()
    return load(root)
''', r"on 3 processes: 2 processes downloaded the dataset at the same time \(rank 0 and rank 2\)"),
    ("04", "the local rank read from LOCAL_RANK (none without a launcher)", '''
def get_dataset(root):
    with idist.one_rank_first(local=True):
        if int(os.environ["LOCAL_RANK"]) == 0 and not is_downloaded(root):
            download(root)
    return load(root)
''', r"on 1 process \(no process group\): rank 0 raised KeyError: 'LOCAL_RANK'"),
    ("04", "only the first node's processes may download (rank < processes per node)",
     [("        if not is_downloaded(root):\n",
       "        if idist.get_rank() < idist.get_nproc_per_node() and not is_downloaded(root):\n")],
     r"on 2 nodes x 2 processes, node 1 \(ranks 2\.\.3, its own folder\): nobody downloaded the dataset into "
     r"this node's folder, and rank 2 found none .*once PER NODE"),
    # structure
    ("04", "each process downloads into a folder of its own", '''
def get_dataset(root):
    mine = os.path.join(root, f"rank{idist.get_rank()}")
    if not is_downloaded(mine):
        download(mine)
    return load(mine)
''', r"on 2 processes: rank 0 downloaded into .*rank0 and rank 1 into .*rank1, not into root \(.*\): "
     r"2 downloads on one node"),
    ("04", "the others poll is_downloaded() instead of waiting at a barrier", '''
def get_dataset(root):
    if idist.get_local_rank() == 0:
        if not is_downloaded(root):
            download(root)
    else:
        while not is_downloaded(root):
            time.sleep(0.01)
    return load(root)
''', r"on 2 processes: rank 1 read the dataset before the download had finished .*it waited in no "
     r"collective.*is_downloaded\(\), which is True as soon as the file EXISTS"),
    ("04", "the others sleep long enough for the download (2 s)", '''
def get_dataset(root):
    if idist.get_local_rank() == 0:
        if not is_downloaded(root):
            download(root)
    else:
        time.sleep(2.0)  # the download takes 0.8 s
    return load(root)
''', r"on 2 processes: rank 1 read the dataset before the download had finished .*it waited in no "
     r"collective"),
    ("04", "the processes take turns, one barrier per turn", '''
def get_dataset(root):
    for turn in range(idist.get_nproc_per_node()):
        if idist.get_local_rank() == turn:
            download(root)
        idist.barrier()
    return load(root)
''', r"on 2 processes: rank 0 and then rank 1 downloaded the dataset, one after the other"),
    # robust
    ("04", "the dataset loaded but not returned", [("    return load(root)", "    load(root)")],
     r"on 2 processes: rank 0 returned None, not the dataset \(a uint8 tensor of shape \(16384,\)\): "
     r"return load\(root\)"),
    ("04", "the folder returned", [("    return load(root)", "    load(root)\n    return root")],
     r"on 2 processes: rank 0 returned '.*data' \(str\), not the dataset \(a uint8 tensor of shape \(16384,\)\)"),
    ("04", "a numpy array returned", [("    return load(root)", "    return load(root).numpy()")],
     r"on 2 processes: rank 0 returned array\(.*\) \(ndarray\), not the dataset \(a uint8 tensor of shape \(16384,\)\)"),
    ("04", "os.listdir on a folder that does not exist yet",
     [("        if not is_downloaded(root):\n", "        if DATA_FILE not in os.listdir(root):\n")],
     r"on 2 processes: rank 0 raised FileNotFoundError: .*04_safe_download.py\", line \d+, in get_dataset"),
    ("04", "local rank 0 waits for the others at a barrier, the others wait for the file", '''
def get_dataset(root):
    if idist.get_local_rank() == 0:
        idist.barrier()
        if not is_downloaded(root):
            download(root)
    else:
        while not is_downloaded(root):
            time.sleep(0.05)
    return load(root)
''', r"on 2 processes: rank 0 waited .*in a collective .*that no other rank matched"),

    # === 05 step timer ===================================================================
    # layout
    ("05", "the largest as the sum minus the smallest (right for 2 ranks)",
     [('return idist.all_reduce(float(seconds), op="MAX")',
       'total = idist.all_reduce(float(seconds))\n'
       '    return total - idist.all_reduce(float(seconds), op="MIN")')],
     r"on 3 processes: rank 0 returned [0-9.]+, but the ranks' step times are \[.*\] and every rank must get "
     r"the largest"),
    ("05", "one process told apart by WORLD_SIZE (none without a launcher)",
     [('    return idist.all_reduce(float(seconds), op="MAX")',
       '    import os\n    if int(os.environ["WORLD_SIZE"]) == 1:\n        return float(seconds)\n'
       '    return idist.all_reduce(float(seconds), op="MAX")')],
     r"on 1 process \(no process group\): rank 0 raised KeyError: 'WORLD_SIZE'"),
    ("05", "the slowest of this node's processes (right on one node)",
     [('return idist.all_reduce(float(seconds), op="MAX")',
       "values = idist.all_gather(float(seconds))\n"
       "    node = idist.get_node_rank() * idist.get_nproc_per_node()\n"
       "    return max(values[node:node + idist.get_nproc_per_node()])")],
     r"on 2 nodes x 2 processes: rank 0 returned [0-9.]+, the largest time of ITS node's 2 processes"),
    ("05", "torch.distributed's world size to skip the collective on one process",
     [('    return idist.all_reduce(float(seconds), op="MAX")',
       '    import torch.distributed as dist\n    if dist.get_world_size() == 1:\n        return float(seconds)\n'
       '    return idist.all_reduce(float(seconds), op="MAX")')],
     r"on 1 process \(no process group\): rank 0 raised ValueError: Default process group has not been initialized"),
    # inputs
    ("05", "the times as whole seconds (int)",
     [('idist.all_reduce(float(seconds), op="MAX")', 'idist.all_reduce(int(seconds), op="MAX")')],
     r"rank 0 returned 0, but the ranks' step times are \[0\.75, 0\.25\]"),
    ("05", "the slowest time rounded to 2 decimals for the log",
     [('return idist.all_reduce(float(seconds), op="MAX")',
       'return round(idist.all_reduce(float(seconds), op="MAX"), 2)')],
     r"on [^:]+: rank \d returned [0-9.]+, but the ranks' step times are .*DISTKIT_CHECK_SEED"),
    ("05", "a bfloat16 all_reduce",
     [('idist.all_reduce(float(seconds), op="MAX")',
       'idist.all_reduce(torch.tensor(float(seconds), dtype=torch.bfloat16), op="MAX").item()'), TORCH],
     r"the all_reduce was given a bfloat16 tensor, which cannot hold these times"),
    ("05", "a float16 all_reduce",
     [('idist.all_reduce(float(seconds), op="MAX")',
       'idist.all_reduce(torch.tensor(float(seconds)).half(), op="MAX").item()'), TORCH],
     r"the all_reduce was given a float16 tensor, which cannot hold these times"),
    ("05", "the times in whole milliseconds",
     [('return idist.all_reduce(float(seconds), op="MAX")',
       'return idist.all_reduce(int(seconds * 1000), op="MAX") / 1000')],
     r"on [^:]+: rank \d returned [0-9.]+, but the ranks' step times are .*DISTKIT_CHECK_SEED"),
    # device
    ("05", "a tensor put on 'cuda' by name",
     [('idist.all_reduce(float(seconds), op="MAX")',
       'idist.all_reduce(torch.tensor(float(seconds), device="cuda"), op="MAX").item()'), TORCH],
     r"rank 0 raised RuntimeError: Found no NVIDIA driver.*put on a GPU by name.*Use idist.device\(\)"),
    ("05", "the tensor moved with .cuda()",
     [('idist.all_reduce(float(seconds), op="MAX")',
       'idist.all_reduce(torch.tensor(float(seconds)).cuda(), op="MAX").item()'), TORCH],
     r"rank 0 raised RuntimeError: Found no NVIDIA driver.*put on a GPU by name"),
    ("05", "the device chosen by global rank (cuda:RANK)",
     [('idist.all_reduce(float(seconds), op="MAX")',
       'idist.all_reduce(torch.tensor(float(seconds), device=f"cuda:{idist.get_rank()}"), op="MAX").item()'),
      TORCH],
     r"rank 0 raised RuntimeError: Found no NVIDIA driver.*put on a GPU by name"),
    ("05", "torch.cuda.set_device(local rank) first",
     [('    return idist.all_reduce(float(seconds), op="MAX")',
       '    torch.cuda.set_device(idist.get_local_rank())\n    return idist.all_reduce(float(seconds), op="MAX")'),
      TORCH],
     r"rank 0 raised RuntimeError: .*put on a GPU by name"),
    ("05", "a tensor on torch.cuda.current_device()",
     [('idist.all_reduce(float(seconds), op="MAX")',
       'idist.all_reduce(torch.tensor(float(seconds), device=torch.cuda.current_device()), op="MAX").item()'),
      TORCH],
     r"rank 0 raised RuntimeError: Found no NVIDIA driver.*put on a GPU by name"),
    ("05", "the tensor sent .to(cuda:local rank)",
     [('idist.all_reduce(float(seconds), op="MAX")',
       'idist.all_reduce(torch.tensor(float(seconds)).to(f"cuda:{idist.get_local_rank()}"), op="MAX").item()'),
      TORCH],
     r"rank 0 raised RuntimeError: Found no NVIDIA driver.*put on a GPU by name"),
    # robust
    ("05", "the Timer not returned", [("    return timer\n", "")],
     r"attach_step_timer returned None: return the ignite.handlers.Timer"),
    ("05", "the trainer returned instead of the timer", [("    return timer\n", "    return trainer\n")],
     r"attach_step_timer returned an Engine, not a Timer: return the ignite.handlers.Timer"),
    ("05", "a Timer created but never attached", '''
def attach_step_timer(trainer):
    return Timer(average=True)
''', r"your timer says [0-9.]+ s, but it is not attached to the trainer: none of its reset, resume, pause or "
     r"step runs"),
    ("05", "average=True passed to attach, not to Timer",
     [("    timer = Timer(average=True)\n", "    timer = Timer()\n"),
      ("step=Events.ITERATION_COMPLETED)", "step=Events.ITERATION_COMPLETED, average=True)")],
     r"attach_step_timer raised TypeError: .*unexpected keyword argument 'average'.*05_step_timer.py\", "
     r"line \d+, in attach_step_timer"),
    ("05", "all_gather's list returned", [('return idist.all_reduce(float(seconds), op="MAX")',
                                          "return idist.all_gather(float(seconds))")],
     r"rank 0 returned \[0\.75, 0\.25\] \(a list of 2\); return a Python float"),
    ("05", "the slowest time computed, not returned",
     [('    return idist.all_reduce(float(seconds), op="MAX")',
       '    slowest = idist.all_reduce(float(seconds), op="MAX")')],
     r"rank 0 returned None \(NoneType\); return a Python float"),
    ("05", "only the rank that measured more than the others reduces (a hang)",
     [('    return idist.all_reduce(float(seconds), op="MAX")',
       '    if idist.get_rank() != 0:  # rank 0 collects the times\n        return float(seconds)\n'
       '    return idist.all_reduce(float(seconds), op="MAX")')],
     r"rank 0 was still waiting (for \d+ s )?in a collective when rank 1 had already finished: every rank must "
     r"call the same collectives.*05_step_timer.py\", line \d+, in slowest_rank"),
    ("05", "the time taken for a tensor (seconds.item())",
     [('idist.all_reduce(float(seconds), op="MAX")', 'idist.all_reduce(seconds.item(), op="MAX")')],
     r"rank 0 raised AttributeError: 'float' object has no attribute 'item'.*05_step_timer.py\", line \d+, "
     r"in slowest_rank"),

    # === 06 learning-rate scaling ========================================================
    ("06", "the scheduler not returned",
     [("    return PiecewiseLinear(optimizer,", "    scheduler = PiecewiseLinear(optimizer,")],
     r"create_lr_scheduler returned None: return the ignite scheduler"),
    ("06", "the milestones returned, not a scheduler", '''
def create_lr_scheduler(optimizer, base_lr, warmup_iters, total_iters):
    peak = base_lr * idist.get_world_size()
    return [(0, 0.0), (warmup_iters, peak), (total_iters, 0.0)]
''', r"create_lr_scheduler returned a list of 3 \(\[\(0, 0\.0\), \(4, 0\.\d+\), \(12, 0\.0\)\]\): return "
     r"the ignite scheduler"),  # peak = base_lr x world size: 0.1 in the first layout, where the grader stops
    ("06", "torch's LambdaLR (a torch scheduler, not ignite's)", '''
def create_lr_scheduler(optimizer, base_lr, warmup_iters, total_iters):
    import torch
    scale = idist.get_world_size()

    def factor(step):
        if step <= warmup_iters:
            return scale * step / warmup_iters
        return scale * (total_iters - step) / (total_iters - warmup_iters)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
''', r"create_lr_scheduler returned a LambdaLR \(torch.optim.lr_scheduler\), not an ignite scheduler: the "
     r"trainer calls an ignite scheduler at every ITERATION_STARTED.*ignite.handlers.LRScheduler"),
    ("06", "the milestones given as a dict",
     [("milestones_values=[", "milestones_values=dict(["), ("        (total_iters, 0.0),     # then decay to 0 at the end of training\n    ])",
                                                          "        (total_iters, 0.0),     # then decay to 0 at the end of training\n    ]))")],
     r"rank 0 raised TypeError: Argument milestones_values should be a list or tuple.*06_lr_scaling.py\", "
     r"line \d+, in create_lr_scheduler"),
    ("06", "the scheduler and its peak returned together",
     [("    return PiecewiseLinear(optimizer,", "    return peak, PiecewiseLinear(optimizer,")],
     r"create_lr_scheduler returned a tuple of 2 .*: return the ignite scheduler"),
    ("06", "the parameter named 'learning_rate' (the optimizer's key is 'lr')",
     [('PiecewiseLinear(optimizer, "lr",', 'PiecewiseLinear(optimizer, "learning_rate",')],
     r"the learning rate never changed: it stayed at the optimizer's own 0\.5 for all 12 iterations.*"
     r"param_name \"lr\""),

    ("06", "the peak read from the optimizer's lr, not base_lr (the example's are the same)",
     [("peak = base_lr * idist.get_world_size()",
       'peak = optimizer.param_groups[0]["lr"] * idist.get_world_size()')],
     r"with 1 process the highest learning rate is 0\.5, the optimizer's own lr \(0\.5\) x 1: scale base_lr, the "
     r"argument"),

    # === 07 checkpoints ==================================================================
    ("07", "only the ranks of node 0 load (the file was written there)",
     [("    Checkpoint.load_objects(_objects(trainer, model, optimizer), read_checkpoint(checkpoint_file))",
       "    if idist.get_node_rank() == 0:\n"
       "        Checkpoint.load_objects(_objects(trainer, model, optimizer), read_checkpoint(checkpoint_file))")],
     r"on 2 nodes x 2 processes: after resume rank 0 at iteration 7 .*rank 2 at iteration 0 .*EVERY rank must load"),
    ("07", "the Checkpoint attached but not returned", [("    return checkpoint\n", "")],
     r"on 2 processes: on every rank attach_checkpointing returned None, not the Checkpoint: return the "
     r"ignite.handlers.Checkpoint you attached"),
    ("07", "the DiskSaver returned instead of the Checkpoint", '''
_attach = attach_checkpointing

def attach_checkpointing(trainer, model, optimizer, dirname):
    checkpoint = _attach(trainer, model, optimizer, dirname)
    return checkpoint.save_handler
''', r"on 2 processes: on every rank attach_checkpointing returned a DiskSaver, not the Checkpoint"),
    ("07", "the Checkpoint and its folder returned together",
     [("    return checkpoint\n", "    return checkpoint, dirname\n")],
     r"on 2 processes: on every rank attach_checkpointing returned a tuple, not the Checkpoint"),
    ("07", "a tutorial's key names ('model_state_dict')", '''
def resume(trainer, model, optimizer, checkpoint_file):
    state = read_checkpoint(checkpoint_file)
    Checkpoint.load_objects({"model": model}, {"model": state["model_state_dict"]})
    Checkpoint.load_objects({"optimizer": optimizer, "trainer": trainer}, state)
''', r"on 2 processes: rank [01] raised KeyError: 'model_state_dict'.*07_checkpoint_resume.py\", line \d+, "
     r"in resume"),
]

# the families of the new answers above
for _number, _family, _names in [
    ("01", "device", ["a tensor on torch.cuda.current_device() (a GPU machine's habit)"]),
    ("01", "robust", ["the mean printed, not returned", "all_gather's list returned (every value, not their mean)",
                      "the mean formatted as a string for the log", "the value taken for a tensor (value.clone())",
                      "the mean and the world size returned together"]),
    ("04", "layout", ["local rank 0 computed as rank % 2 (nodes of 2 GPUs)",
                      "the local rank read from LOCAL_RANK (none without a launcher)",
                      "only the first node's processes may download (rank < processes per node)"]),
    ("04", "structure", ["each process downloads into a folder of its own",
                         "the others poll is_downloaded() instead of waiting at a barrier",
                         "the others sleep long enough for the download (2 s)",
                         "the processes take turns, one barrier per turn"]),
    ("04", "robust", ["the dataset loaded but not returned", "the folder returned", "a numpy array returned",
                      "os.listdir on a folder that does not exist yet",
                      "local rank 0 waits for the others at a barrier, the others wait for the file"]),
    ("05", "layout", ["the largest as the sum minus the smallest (right for 2 ranks)",
                      "one process told apart by WORLD_SIZE (none without a launcher)",
                      "the slowest of this node's processes (right on one node)",
                      "torch.distributed's world size to skip the collective on one process"]),
    ("05", "inputs", ["the times as whole seconds (int)", "the slowest time rounded to 2 decimals for the log",
                      "a bfloat16 all_reduce", "a float16 all_reduce", "the times in whole milliseconds"]),
    ("05", "device", ["a tensor put on 'cuda' by name", "the tensor moved with .cuda()",
                      "the device chosen by global rank (cuda:RANK)", "torch.cuda.set_device(local rank) first",
                      "a tensor on torch.cuda.current_device()", "the tensor sent .to(cuda:local rank)"]),
    ("05", "robust", ["the Timer not returned", "the trainer returned instead of the timer",
                      "a Timer created but never attached", "average=True passed to attach, not to Timer",
                      "all_gather's list returned", "the slowest time computed, not returned",
                      "only the rank that measured more than the others reduces (a hang)",
                      "the time taken for a tensor (seconds.item())"]),
    ("06", "inputs", ["the peak read from the optimizer's lr, not base_lr (the example's are the same)"]),
    ("06", "robust", ["the scheduler not returned", "the milestones returned, not a scheduler",
                      "torch's LambdaLR (a torch scheduler, not ignite's)", "the milestones given as a dict",
                      "the scheduler and its peak returned together",
                      "the parameter named 'learning_rate' (the optimizer's key is 'lr')"]),
    ("07", "layout", ["only the ranks of node 0 load (the file was written there)"]),
    ("07", "robust", ["the Checkpoint attached but not returned", "the DiskSaver returned instead of the Checkpoint",
                      "the Checkpoint and its folder returned together", "a tutorial's key names ('model_state_dict')"]),
]:
    for _name in _names:
        FAMILY[(_number, _name)] = _family
