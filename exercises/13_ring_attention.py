"""Exercise 13 (advanced): ring attention, the core of context parallelism.

Notebook 13 splits a sequence of T tokens over N ranks: rank r holds the queries, keys
and values of the contiguous block of tokens ``r*T/N .. (r+1)*T/N - 1``, each a tensor
(batch, heads, T/N, head_dim). Causal attention needs, for every query, the keys and
values of every token up to it: for rank r, the blocks of ranks 0 .. r. Instead of
gathering them all, the blocks travel round a ring, one step at a time, and an online
softmax merges them as they come.

Task: write ``ring_attention(q, k, v)``, called on every rank at once with this rank's
block, returning this rank's rows of ``softmax(q @ k.T / sqrt(head_dim) + causal
mask) @ v`` over the WHOLE sequence:

- N steps. At step s (0, 1, .., N-1) the rank holds the key/value block that started on
  rank ``(r - s) % N``. Except at the last step, start sending the block it holds to
  rank ``(r + 1) % N`` and receiving the next one from rank ``(r - 1) % N`` first, then
  compute with the block it holds, then wait for the transfer.
- A block from a rank after r is skipped (its keys all come after every query of r); the
  block of rank r itself (the diagonal) needs the causal mask (query i sees keys <= i
  within the block); a block from a rank before r is seen whole.
- Online softmax: per query row keep the running maximum ``m`` of the scores, the running
  sum ``l`` of ``exp(score - m)`` and the running ``acc`` of ``exp(score - m) @ v``. With a
  new block: ``m_new = max(m, block's row max)``; rescale ``l`` and ``acc`` by
  ``exp(m - m_new)`` and add the block's ``exp(score - m_new)`` sums and products. Return
  ``acc / l``.

Do not gather the keys and values of the whole sequence (no all_gather): holding them
all on every rank is what context parallelism avoids. The check runs it with 2 and 3 gloo
processes, 2 "nodes" of 2 processes and 1 process with no process group, on seeded random
blocks with attention scores of large magnitude (about +-100, and rows near -200), and
compares every rank's rows with the reference solution's (= causal attention over the
whole sequence); it records the transfers and products to check the ring's structure.

Tools: ``idist.get_rank()``, ``idist.get_world_size()``; ``dist.P2POp(dist.isend,
tensor, peer)``, ``dist.P2POp(dist.irecv, buffer, peer)`` and
``dist.batch_isend_irecv([...])``, which returns requests to ``.wait()`` on (or
``dist.isend`` / ``dist.irecv``); ``torch.empty_like``, ``masked_fill``, ``amax``,
``torch.exp``, ``torch.maximum``; ``causal_mask`` below.

Check it:  pytest exercises -m ex13     (or: distkit check 13)
Stuck?     distkit check 13 --hint     (or read exercises/hints.md)
"""
import math

import ignite.distributed as idist
import torch
import torch.distributed as dist


def causal_mask(size):
    """Given: True where a key comes after a query in a diagonal block (row = query, column
    = key): the scores to set to -inf. Do not change it."""
    return torch.ones(size, size, dtype=torch.bool).triu(diagonal=1)


def ring_attention(q, k, v):
    """This rank's rows of causal attention over the whole sequence, by a ring of N steps."""
    # TODO: running m, l, acc; for each step: post the exchange (unless last), attend to
    # the block held (skip / diagonal mask / whole), wait, swap in the received block.
    raise NotImplementedError("exercise 13: write ring_attention")
