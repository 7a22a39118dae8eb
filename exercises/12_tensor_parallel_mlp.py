"""Exercise 12 (advanced): a tensor-parallel MLP, split column-then-row, with one all-reduce.

Notebooks 11 and 12 split an MLP over ranks with ``parallelize_module``
(``ColwiseParallel`` then ``RowwiseParallel``). Here you write that split by hand.

The MLP is ``y = relu(x @ w1.T + b1) @ w2.T + b2``, in ``nn.Linear``'s layout: ``w1`` is
(hidden, d_in), ``b1`` (hidden,), ``w2`` (d_out, hidden), ``b2`` (d_out,). Its hidden
units are independent of each other up to the second layer, so N ranks can share them:

- **column-parallel first layer**: rank r of N keeps its own contiguous slice of the
  hidden units, ``hidden // N`` of them starting at ``r * (hidden // N)``: those rows of
  ``w1`` and entries of ``b1``. It computes its slice of the hidden activations, ReLU
  included, with no communication at all.
- **row-parallel second layer**: the same rank keeps the matching COLUMNS of ``w2`` (the
  second layer's input features that are its hidden units). Its product is a partial
  sum of the output: the sum over the ranks' partial outputs is ``x``'s full output
  (before ``b2``).

Task: write ``tensor_parallel_mlp(x, w1, b1, w2, b2)``, called on every rank at once with
the same input ``x`` (batch, d_in) and the FULL weights. Use only this rank's slices for
the products, combine the partial outputs with exactly ONE all-reduce (a sum), add ``b2``
once, and return the full output (batch, d_out) on every rank. The check runs it with 2
and 3 gloo processes, 2 "nodes" of 2 processes and 1 process with no process group (the
same code must run there), on seeded random inputs, and compares with the reference
solution's output; it also records what each rank hands to ``torch.distributed``.

Tools: ``idist.get_rank()``, ``idist.get_world_size()``, slicing (``w[a:b]``,
``w[:, a:b]``), ``F.linear(x, w, b)`` (= ``x @ w.T + b``), ``F.relu``,
``dist.all_reduce(tensor)`` (in place, a sum by default) or ``idist.all_reduce(tensor)``
(returns the sum).

Check it:  pytest exercises -m ex12     (or: distkit check 12)
Stuck?     distkit check 12 --hint     (or read exercises/hints.md)
"""
import ignite.distributed as idist
import torch
import torch.distributed as dist
import torch.nn.functional as F


def tensor_parallel_mlp(x, w1, b1, w2, b2):
    """The MLP's output for ``x``, computed from this rank's slice of the hidden units."""
    # TODO: slice w1's rows, b1 and w2's columns for this rank; relu(F.linear(...)); the
    # partial output; one all-reduce (sum); add b2 once; return it.
    raise NotImplementedError("exercise 12: write tensor_parallel_mlp")
