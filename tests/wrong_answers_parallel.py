"""Plausible wrong answers to exercises 12 (tensor-parallel MLP) and 13 (ring attention),
in the format of ``WRONG_ANSWERS`` in test_exercises.py, which grades them with the
others: (exercise, what the learner did, the change to the solution, what the learner
must read). Kept in a file of their own so that the transformer track's exercises and
exercises 01-11 are edited apart."""

WRONG_ANSWERS_12_13 = [
    # 12 tensor-parallel MLP
    ("12", "all-reduce after the column layer",
     [("    hidden = F.relu(F.linear(x, w1[mine], b1[mine]))\n",
       "    hidden = F.relu(F.linear(x, w1[mine], b1[mine]))\n    dist.all_reduce(hidden)\n")],
     r"rank \d all-reduced a tensor of shape \(8, 10\): the hidden activations after the column layer"),
    ("12", "no all-reduce", [("        dist.all_reduce(partial)  #", "        pass  #")],
     r"rank \d returned its own partial output: no all-reduce"),
    ("12", "the wrong shard of w2 (a strided slice of its columns)",
     [("partial = F.linear(hidden, w2[:, mine])", "partial = F.linear(hidden, w2[:, rank::n])")],
     r"all-reduced a partial output that is not the one of its hidden units .*Take the SAME contiguous "
     r"slice of hidden units from w1's rows, b1, and w2's columns"),
    ("12", "b2 added on every rank before the all-reduce",
     [("partial = F.linear(hidden, w2[:, mine])", "partial = F.linear(hidden, w2[:, mine], b2)"),
      ("    return partial + b2  #", "    return partial  #")],
     r"output is the MLP's plus 1 × b2: every rank added b2 before the all-reduce"),
    ("12", "the partial outputs averaged",
     [("        dist.all_reduce(partial)  #", "        dist.all_reduce(partial)\n        partial /= n  #")],
     r"output is the MLP's divided by 2: the all-reduce averaged the partial outputs"),
    ("12", "the whole MLP on every rank, nothing split",
     [("    mine = slice(rank * size, (rank + 1) * size)", "    mine = slice(None)"),
      ("        dist.all_reduce(partial)  #", "        pass  #")],
     r"computed the right output without any collective: it used the whole weights, so nothing was split"),
    # 13 ring attention
    ("13", "no 1/sqrt(d) scaling",
     [("scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])", "scores = q @ k.transpose(-2, -1)")],
     r"the scores were not scaled: divide q @ k.T by sqrt\(head_dim\)"),
    ("13", "the online-softmax rescale forgotten",
     [("rescale = torch.exp(m - m_new)", "rescale = torch.ones_like(m)")],
     r"the online softmax forgot to rescale: .*multiply both by exp\(m - m_new\)"),
    ("13", "no causal mask on the diagonal block",
     [("            if source == rank:  #", "            if False:  #")],
     r"the diagonal block \(this rank's own keys\) was not masked"),
    ("13", "the mask keeps out the diagonal itself",
     [("scores = scores.masked_fill(causal_mask(q.shape[-2]), float(\"-inf\"))",
       "scores = scores.masked_fill(causal_mask(q.shape[-2]) | torch.eye(q.shape[-2], dtype=torch.bool), "
       "float(\"-inf\"))")],
     r"the output holds NaN: some row had every score masked"),
    ("13", "the ring turned the wrong way",
     [("dist.P2POp(dist.isend, k, (rank + 1) % n), dist.P2POp(dist.isend, v, (rank + 1) % n)",
       "dist.P2POp(dist.isend, k, (rank - 1) % n), dist.P2POp(dist.isend, v, (rank - 1) % n)"),
      ("dist.P2POp(dist.irecv, k_next, (rank - 1) % n), dist.P2POp(dist.irecv, v_next, (rank - 1) % n)",
       "dist.P2POp(dist.irecv, k_next, (rank + 1) % n), dist.P2POp(dist.irecv, v_next, (rank + 1) % n)")],
     r"the blocks went round the ring the wrong way"),
    ("13", "later ranks' blocks not skipped", [("        if source <= rank:  #", "        if True:  #")],
     r"the blocks of later ranks were attended to"),
    ("13", "the whole sequence gathered", '''
def ring_attention(q, k, v):
    rank, n = idist.get_rank(), idist.get_world_size()
    keys = torch.cat([t for t in idist.all_gather(k.unsqueeze(0))], dim=-2)
    values = torch.cat([t for t in idist.all_gather(v.unsqueeze(0))], dim=-2)
    size = q.shape[-2]
    positions_q = torch.arange(rank * size, (rank + 1) * size)
    scores = q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.arange(n * size)[None, :] > positions_q[:, None], float("-inf"))
    return torch.softmax(scores, dim=-1) @ values
''', r"rank \d used \['allgather.*that puts the keys and values of the whole sequence on every rank"),
]
