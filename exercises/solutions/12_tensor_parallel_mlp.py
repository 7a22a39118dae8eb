"""Exercise 12 (advanced): a tensor-parallel MLP, split column-then-row, with one all-reduce.
(Solution.)

See ``exercises/12_tensor_parallel_mlp.py`` for the task.
"""
import ignite.distributed as idist
import torch
import torch.distributed as dist
import torch.nn.functional as F


def tensor_parallel_mlp(x, w1, b1, w2, b2):
    """The MLP's output for ``x``, computed from this rank's slice of the hidden units."""
    rank, n = idist.get_rank(), idist.get_world_size()
    size = w1.shape[0] // n
    mine = slice(rank * size, (rank + 1) * size)  # this rank's hidden units
    # Column-parallel: rows of w1 and b1 are hidden units. Each rank's slice of the hidden
    # activations is complete on its own (ReLU acts unit by unit): no communication here.
    hidden = F.relu(F.linear(x, w1[mine], b1[mine]))
    # Row-parallel: the same hidden units are columns of w2. Every rank's product is a
    # partial sum of the output; their sum is the whole product.
    partial = F.linear(hidden, w2[:, mine])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(partial)  # the one collective of the forward: sum the partial outputs
    return partial + b2  # once, after the sum (added before it, it would count N times)
