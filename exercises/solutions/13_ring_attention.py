"""Exercise 13 (advanced): ring attention, the core of context parallelism. (Solution.)

See ``exercises/13_ring_attention.py`` for the task.
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
    rank, n = idist.get_rank(), idist.get_world_size()
    rows = q.shape[:-1]
    m = torch.full(rows, float("-inf"), device=q.device)  # running row maximum of the scores
    l = torch.zeros(rows, device=q.device)  # running sum of exp(score - m)
    acc = torch.zeros_like(q)  # running sum of exp(score - m) @ v
    for step in range(n):
        if step < n - 1:  # pass the block on while computing with it
            k_next, v_next = torch.empty_like(k), torch.empty_like(v)
            requests = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, k, (rank + 1) % n), dist.P2POp(dist.isend, v, (rank + 1) % n),
                dist.P2POp(dist.irecv, k_next, (rank - 1) % n), dist.P2POp(dist.irecv, v_next, (rank - 1) % n)])
        source = (rank - step) % n  # the rank whose tokens these keys and values are
        if source <= rank:  # a later rank's keys all come after our queries: skip them
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            if source == rank:  # the diagonal block: query i sees keys 0..i only
                scores = scores.masked_fill(causal_mask(q.shape[-2]).to(q.device), float("-inf"))
            m_new = torch.maximum(m, scores.amax(dim=-1))
            p = torch.exp(scores - m_new[..., None])
            rescale = torch.exp(m - m_new)  # what was summed so far was relative to the old max
            l = l * rescale + p.sum(dim=-1)
            acc = acc * rescale[..., None] + p @ v
            m = m_new
        if step < n - 1:
            for request in requests:
                request.wait()
            k, v = k_next, v_next
    return acc / l[..., None]
