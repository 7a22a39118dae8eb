"""Plausible wrong answers to exercise 17 (where each rank resumes when the world size
changes), in the format of ``WRONG_ANSWERS`` in test_exercises.py, which grades them with
the others: (exercise, what the learner did, the change to the solution, what the learner
must read). ``FAMILY`` tags each; ``APPLIES`` / ``NOT_APPLICABLE`` decide the families
(tests/wrong_answer_families.py reads them)."""

_SAMPLER_PADDING = '''
def rank_batches(consumed, epoch_size, rank, world_size, batch_per_rank):
    rest = list(range(consumed, epoch_size))
    rest += rest[:(-len(rest)) % world_size]  # as DistributedSampler: every rank as many
    mine = rest[rank::world_size]
    return [mine[i:i + batch_per_rank] for i in range(0, len(mine), batch_per_rank)]
'''

WRONG_ANSWERS = [
    # --- understanding: the task itself ----------------------------------------------
    ("17", "the epoch counted from 1, as ignite's engine.state.epoch", '''
def resume_position(iteration, epoch_length, world_size, batch_per_rank):
    epoch = iteration // epoch_length + 1  # ignite's epochs start at 1
    return epoch, (iteration % epoch_length) * world_size * batch_per_rank
''', r"returned \(2, 6\), not \(1, 6\): the epoch is counted from 1 there .*set_epoch counts from 0"),
    ("17", "one rank's positions counted",
     [("* world_size * batch_per_rank\n", "* batch_per_rank\n")],
     r"returned \(1, 3\), not \(1, 6\): that is ONE rank's share of the 1 step\(s\) of this epoch: each step trained "
     r"a GLOBAL batch, 2 x 3 positions"),
    ("17", "the steps counted, not the positions",
     [("consumed = (iteration - epoch * epoch_length) * world_size * batch_per_rank",
       "consumed = iteration - epoch * epoch_length")],
     r"returned \(1, 1\), not \(1, 6\): that counts the 1 step\(s\) trained in this epoch, not the positions they "
     r"covered \(2 x 3 each\)"),
    ("17", "the old batch per rank kept", '''
def new_batch_per_rank(world_size, batch_per_rank, new_world_size):
    return batch_per_rank  # every process keeps its batch
''', r"new_batch_per_rank\(world_size=2, batch_per_rank=3, new_world_size=3\) returned 3, not 2: that is the old "
     r"batch per rank: 3 processes of 3 would train a global batch of 9, not 6"),
    ("17", "the global batch given to every rank", '''
def new_batch_per_rank(world_size, batch_per_rank, new_world_size):
    return world_size * batch_per_rank  # --batch-size is the global batch
''', r"returned 6, not 2: that is the whole global batch; each of the 3 processes takes its share of it"),
    ("17", "a contiguous block of each global batch per rank", '''
def rank_batches(consumed, epoch_size, rank, world_size, batch_per_rank):
    step, batches = world_size * batch_per_rank, []
    for start in range(consumed, epoch_size, step):
        end = min(start + step, epoch_size)
        mine = list(range(min(start + rank * batch_per_rank, end), min(start + (rank + 1) * batch_per_rank, end)))
        if mine:
            batches.append(mine)
    return batches
''', r"every position is trained once, in the right global batches, but rank_batches\(consumed=6, epoch_size=22, "
     r"rank=0, world_size=3, batch_per_rank=2\)'s batch 0 is \[6, 7\], and DistributedSampler deals that rank "
     r"\[6, 9\]: of each global batch, counted from its first position, rank r takes the positions r, "
     r"r \+ 3, r \+ 6"),
    ("17", "the epoch dealt again from its start", [("range(consumed + rank, epoch_size", "range(rank, epoch_size")],
     r"position 0 is trained twice, before the stop and by rank 0 in its batch 0: those were trained before the "
     r"stop: start after them"),
    # --- inputs: right where the sizes divide, in the first epoch, between epochs ----------
    ("17", "the global batch divided without a refusal (right where it divides)",
     [("    if global_batch % new_world_size:\n", "    if False:  # the division rounds down anyway\n")],
     r"new_batch_per_rank\(world_size=2, batch_per_rank=3, new_world_size=4\) returned 1: 4 processes of 1 train 4 "
     r"positions a step, not the global batch of 6: the run would quietly train other batches.*raise ValueError"),
    ("17", "the batch per rank rounded up (right where it divides)", '''
def new_batch_per_rank(world_size, batch_per_rank, new_world_size):
    import math
    return math.ceil(world_size * batch_per_rank / new_world_size)  # never less than the global batch
''', r"returned 2: 4 processes of 2 train 8 positions a step, not the global batch of 6"),
    ("17", "the epoch's short last batch dropped (right where the epoch divides)", '''
def rank_batches(consumed, epoch_size, rank, world_size, batch_per_rank):
    mine = list(range(consumed + rank, epoch_size, world_size))
    full = (epoch_size - consumed) // (world_size * batch_per_rank)  # whole global batches
    return [mine[i * batch_per_rank:(i + 1) * batch_per_rank] for i in range(full)]
''', r"4 position\(s\) are never trained \(18, 19, 20, 21\), the epoch's last of them 21: every position left after "
     r"the stop is trained once, a short last global batch too"),
    ("17", "the short last batch padded as DistributedSampler pads it (right where it divides)", _SAMPLER_PADDING,
     r"on 3 process\(es\) of 2, resuming after position 6 of 22: position 6 is trained twice, by rank 0 in its batch 0 "
     r"and by rank 1 in its batch 2: count every position once, even in the epoch's short last batch"),
    ("17", "the last global batch filled up past the epoch's end (right where it divides)", '''
def rank_batches(consumed, epoch_size, rank, world_size, batch_per_rank):
    step = world_size * batch_per_rank
    steps = -(-(epoch_size - consumed) // step)
    return [list(range(consumed + j * step + rank, consumed + (j + 1) * step, world_size)) for j in range(steps)]
''', r"rank 1's batch 2 holds position 22, outside the epoch \(0 to 21\): the epoch's last global batch is short, "
     r"not filled up"),
    ("17", "an empty batch for a rank with nothing left (right where the rest divides)", '''
def rank_batches(consumed, epoch_size, rank, world_size, batch_per_rank):
    step = world_size * batch_per_rank
    return [list(range(start + rank, min(start + step, epoch_size), world_size))
            for start in range(consumed, epoch_size, step)]
''', r"rank_batches\(consumed=\d+, epoch_size=\d+, rank=\d+, world_size=\d+, batch_per_rank=\d+\)'s batch \d+ is "
     r"empty; a rank with nothing left has one batch fewer .*DISTKIT_CHECK_SEED=\d+ replays"),
    ("17", "the positions of every epoch since the start (right in the first epoch)",
     [("consumed = (iteration - epoch * epoch_length) * world_size * batch_per_rank",
       "consumed = iteration * world_size * batch_per_rank")],
     r"returned \(1, 30\), not \(1, 6\): that counts the positions of every step since the start; the earlier "
     r"epochs' do not count: only the 1 step\(s\) of epoch 1"),
    ("17", "a stop at an epoch's end resumed in the finished epoch", '''
def resume_position(iteration, epoch_length, world_size, batch_per_rank):
    epoch = max(iteration - 1, 0) // epoch_length  # the epoch of the last step trained
    return epoch, (iteration - epoch * epoch_length) * world_size * batch_per_rank
''', r"returned \(1, 24\), not \(2, 0\): after 8 steps epoch 1 is over: the run resumes at the start of epoch 2, "
     r"with nothing of it trained \(consumed 0\)"),
    # --- robust: what the check must survive and describe ---------------------------------
    ("17", "the position returned as a dict", '''
def resume_position(iteration, epoch_length, world_size, batch_per_rank):
    epoch = iteration // epoch_length
    return {"epoch": epoch, "consumed": (iteration - epoch * epoch_length) * world_size * batch_per_rank}
''', r"returned \{'epoch': 1, 'consumed': 6\} \(dict\): return \(epoch, consumed\), two ints"),
    ("17", "the batch per rank as a float (true division)",
     [("    return global_batch // new_world_size", "    return global_batch / new_world_size")],
     r"returned 2\.0, not 2: a batch size is a whole number: return an int, not a float"),
    ("17", "None where the global batch does not divide", '''
def new_batch_per_rank(world_size, batch_per_rank, new_world_size):
    if (world_size * batch_per_rank) % new_world_size == 0:
        return world_size * batch_per_rank // new_world_size
''', r"new_batch_per_rank\(world_size=2, batch_per_rank=3, new_world_size=4\) returned None: no whole batch per rank "
     r"keeps the global batch of 6 on 4 processes: raise ValueError"),
    ("17", "an assert where the global batch does not divide",
     [("    if global_batch % new_world_size:\n        raise ValueError(",
       "    assert global_batch % new_world_size == 0, (")],
     r"new_batch_per_rank\(world_size=2, batch_per_rank=3, new_world_size=4\) raised AssertionError: .*; raise "
     r"ValueError when the global batch \(6\) does not divide by the new world size"),
    ("17", "the positions not cut into batches",
     [("    return [mine[start:start + batch_per_rank] for start in range(0, len(mine), batch_per_rank)]",
       "    return mine")],
     r"rank_batches\(consumed=6, .*\): its batch 0 is an int: return the positions in batches, a list per batch"),
    ("17", "the batches yielded (a generator)", '''
def rank_batches(consumed, epoch_size, rank, world_size, batch_per_rank):
    mine = list(range(consumed + rank, epoch_size, world_size))
    for start in range(0, len(mine), batch_per_rank):
        yield mine[start:start + batch_per_rank]
''', r"rank_batches\(consumed=6, .*\) returned <generator object rank_batches .*: return a list of batches"),
    ("17", "the batches printed, not returned",
     [("    return [mine[start:start + batch_per_rank] for start in range(0, len(mine), batch_per_rank)]",
       "    print([mine[start:start + batch_per_rank] for start in range(0, len(mine), batch_per_rank)])")],
     r"rank_batches\(consumed=6, .*\) returned None: return a list of batches"),
    ("17", "each batch a tensor (torch.arange)", '''
def rank_batches(consumed, epoch_size, rank, world_size, batch_per_rank):
    import torch
    return list(torch.arange(consumed + rank, epoch_size, world_size).split(batch_per_rank))
''', r"rank_batches\(consumed=6, .*\): its batch 0 is a int64 tensor of shape \(2,\) \(return a list of lists of "
     r"ints\)"),
]

_KINDS = {"understanding": range(0, 7), "inputs": range(7, 15), "robust": range(15, 23)}
FAMILY = {("17", WRONG_ANSWERS[i][1]): kind for kind, indices in _KINDS.items() for i in indices}

APPLIES = {"17": ("inputs", "robust")}
NOT_APPLICABLE = {
    ("17", "layout"): "the three functions run in one process and take the world sizes as arguments (the "
                      "checkpoint's and the new run's): no process group, no rank of their own. The layouts, "
                      "world sizes 1 to 4 before and after, are what the check draws as inputs, and the answers "
                      "right on some of them only are graded as inputs",
    ("17", "structure"): "arithmetic on positions, compared exactly with the reference's and with "
                         "DistributedSampler's: how the answer computes them has nothing to teach",
    ("17", "device"): "no tensor, no device and no collective: positions are ints",
}
