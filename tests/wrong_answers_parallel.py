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
     r"on 2 processes, rank \d all-reduced a tensor of shape \(8, 12\): the hidden activations after the column layer"),
    ("12", "no all-reduce", [("        dist.all_reduce(partial)  #", "        pass  #")],
     r"rank \d returned its own partial output: no all-reduce"),
    ("12", "the wrong shard of w2 (a strided slice of its columns)",
     [("partial = F.linear(hidden, w2[:, mine])", "partial = F.linear(hidden, w2[:, rank::n])")],
     r"all-reduced a partial output that is not the one of its hidden units .*Take the SAME contiguous "
     r"slice of hidden units from w1's rows, b1, and w2's columns"),
    ("12", "b2 added on every rank before the all-reduce",
     [("partial = F.linear(hidden, w2[:, mine])", "partial = F.linear(hidden, w2[:, mine], b2)"),
      ("    return partial + b2  #", "    return partial  #")],
     r"on 2 processes, rank 0's output is the MLP's plus 1 × b2: every rank added b2 before the all-reduce"),
    ("12", "the partial outputs averaged",
     [("        dist.all_reduce(partial)  #", "        dist.all_reduce(partial)\n        partial /= n  #")],
     r"output is the MLP's divided by 2: the all-reduce averaged the partial outputs"),
    ("12", "the whole MLP on every rank, nothing split",
     [("    mine = slice(rank * size, (rank + 1) * size)", "    mine = slice(None)"),
      ("        dist.all_reduce(partial)  #", "        pass  #")],
     r"computed the right output without any collective: it used the whole weights, so nothing was split"),
    # 12, layouts: wrong on one layout only
    ("12", "the local rank for the global rank (right on one node, wrong on 2 x 2)",
     [("rank, n = idist.get_rank(), idist.get_world_size()", "rank, n = idist.get_local_rank(), idist.get_world_size()")],
     r"on 2 nodes x 2 processes, rank 2 all-reduced a partial output that is not the one of its hidden units "
     r"12\.\.17.*with r the GLOBAL rank \(idist.get_rank\(\)\).*DISTKIT_CHECK_SEED=\d+ replays"),
    ("12", "the processes per node for the world size (right on one node, wrong on 2 x 2)",
     [("rank, n = idist.get_rank(), idist.get_world_size()", "rank, n = idist.get_rank(), idist.get_nproc_per_node()")],
     r"on 2 nodes x 2 processes, rank 0 all-reduced a partial output that is not the one of its hidden units 0\.\.5"),
    ("12", "an all-reduce with no process group (right on 2+, raises on 1 process)",
     [("    if dist.is_available() and dist.is_initialized():\n        dist.all_reduce(partial)",
       "    if True:\n        dist.all_reduce(partial)")],
     r"on 1 process \(no process group\): rank 0 raised ValueError: Default process group has not been initialized"),
    ("12", "a world size of 2 written in (right on 2 processes only)",
     [("size = w1.shape[0] // n", "size = w1.shape[0] // 2")],
     r"on 3 processes, rank 0 all-reduced a partial output that is not the one of its hidden units 0\.\.7"),
    ("12", "the partial outputs all-gathered, then summed (a list output: the old recorder crashed on it)",
     [("        dist.all_reduce(partial)  #", "        parts = [torch.empty_like(partial) for _ in range(n)]\n"
       "        dist.all_gather(parts, partial)\n        partial = sum(parts)  #")],
     r"on 2 processes, rank 0 made 1 call\(s\) of torch.distributed, \[\('all_gather', \(8, 7\)\)\]: the split "
     r"needs exactly one all-reduce"),
    # 12, values and what is returned
    ("12", "the partial outputs summed in bfloat16",
     [("        dist.all_reduce(partial)  #", "        partial = partial.bfloat16()\n        dist.all_reduce(partial)\n"
       "        partial = partial.float()  #")],
     r"on 2 processes, rank 0 all-reduced a torch.bfloat16 tensor: the inputs are float32"),
    ("12", "the output returned in a list", [("    return partial + b2  #", "    return [partial + b2]  #")],
     r"on 2 processes, rank 0 returned a list of 1: return the MLP's whole output, a tensor of shape \(8, 7\)"),
    ("12", "nothing returned", [("    return partial + b2  #", "    partial + b2  #")],
     r"on 2 processes, rank 0 returned None: return the MLP's whole output"),
    ("12", "the output transposed", [("    return partial + b2  #", "    return (partial + b2).T  #")],
     r"on 2 processes, rank 0 returned a float32 tensor of shape \(7, 8\)"),
    ("12", "ReLU after the all-reduce (on the sum, not on each hidden unit)",
     [("    hidden = F.relu(F.linear(x, w1[mine], b1[mine]))", "    hidden = F.linear(x, w1[mine], b1[mine])"),
      ("    return partial + b2  #", "    return F.relu(partial) + b2  #")],
     r"on 2 processes, rank 0 all-reduced a partial output that is not the one of its hidden units 0\.\.11"),
    ("12", "b2 added by rank 0 only, after the all-reduce",
     [("    return partial + b2  #", "    return partial + b2 if idist.get_rank() == 0 else partial  #")],
     r"on 2 processes, rank 1's output lacks b2"),
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
     [("scores = scores.masked_fill(causal_mask(q.shape[-2]).to(q.device), float(\"-inf\"))",
       "scores = scores.masked_fill(causal_mask(q.shape[-2]) | torch.eye(q.shape[-2], dtype=torch.bool), "
       "float(\"-inf\"))")],
     r"the mask keeps out the diagonal itself: a query must see its own key"),
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
''', r"on 2 processes, rank \d used \['all_gather.*that puts the keys and values of the whole sequence on every rank"),
    # 13, structure: the right rows computed the wrong way
    ("13", "waits for the next block before computing on the current one",
     [("        source = (rank - step) % n  # the rank", "        if step < n - 1:\n            for request in requests:\n"
       "                request.wait()\n            requests = []\n        source = (rank - step) % n  # the rank")],
     r"on 2 processes, rank 0 computed on a block while the next one was in flight 0 time\(s\) of 1: it waited "
     r"for a block"),
    ("13", "keeps every block it received (collects the sequence)",
     [("    acc = torch.zeros_like(q)  #", "    kept = []\n    acc = torch.zeros_like(q)  #"),
      ("            k, v = k_next, v_next", "            kept.append((k_next, v_next))\n            k, v = k_next, v_next")],
     r"on 2 nodes x 2 processes, rank [1-3] held [3-9] received key/value blocks at once while computing: a ring keeps only "
     r"the block it computes with and the one arriving"),
    ("13", "blocks sent two ranks on (a ring that skips a neighbour)",
     [("dist.P2POp(dist.isend, k, (rank + 1) % n), dist.P2POp(dist.isend, v, (rank + 1) % n)",
       "dist.P2POp(dist.isend, k, (rank + 2) % n), dist.P2POp(dist.isend, v, (rank + 2) % n)"),
      ("dist.P2POp(dist.irecv, k_next, (rank - 1) % n), dist.P2POp(dist.irecv, v_next, (rank - 1) % n)",
       "dist.P2POp(dist.irecv, k_next, (rank - 2) % n), dist.P2POp(dist.irecv, v_next, (rank - 2) % n)")],
     r"on 2 processes: rank 0 raised RuntimeError: .*Pair is not connected.*gloo has no connection from a rank to "
     r"itself"),
    # 13, adversarial values and layouts
    ("13", "the running maximum started at 0",
     [('    m = torch.full(rows, float("-inf"), device=q.device)', "    m = torch.zeros(rows, device=q.device)")],
     r"on 2 processes, ranks \[0, 1\] returned other rows than the reference: the running maximum started at 0, "
     r"not -inf"),
    ("13", "the scores computed in bfloat16",
     [("scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])",
       "scores = (q.bfloat16() @ k.bfloat16().transpose(-2, -1)).float() / math.sqrt(q.shape[-1])")],
     r"on 2 processes, rank 0: its rows: \d+ of 160 entries differ.*DISTKIT_CHECK_SEED=\d+ replays"),
    ("13", "torch.distributed's rank (right with a process group, raises on 1 process)",
     [("rank, n = idist.get_rank(), idist.get_world_size()", "rank, n = dist.get_rank(), dist.get_world_size()")],
     r"on 1 process \(no process group\): rank 0 raised ValueError: Default process group has not been initialized"),
    ("13", "the local rank for the rank (right on one node, wrong on 2 x 2)",
     [("rank, n = idist.get_rank(), idist.get_world_size()", "rank, n = idist.get_local_rank(), idist.get_world_size()")],
     r"on 2 nodes x 2 processes[,:] rank [0-3] (exchanged blocks with other ranks than its ring neighbours|"
     r"waited.* in a collective or a point-to-point transfer)"),
    ("13", "the rows returned in a list", [("    return acc / l[..., None]", "    return [acc / l[..., None]]")],
     r"on 2 processes, rank 0 returned a list of 1: return this rank's rows of the attention"),
]
