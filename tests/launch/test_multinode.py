"""Two "nodes" on 127.0.0.1: two torchrun launches (--nnodes=2, --node_rank 0 and 1)
running the unchanged `distkit train`. Both must finish and agree on the final weights."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support import subprocess_env
from distkit.host.facts import free_port


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_nodes_on_loopback_agree(tmp_path):
    port = free_port()
    procs = []
    for node_rank in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
               f"--node_rank={node_rank}", "--nproc_per_node=1", "--master_addr=127.0.0.1",
               f"--master_port={port}", "-m", "distkit", "train", "--epochs", "2",
               "--no-progress", "--output-dir", str(tmp_path / f"node{node_rank}")]
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=subprocess_env(), text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=200))
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    # Rank 0 lives on node 0: it writes the results, node 1 writes nothing.
    (results,) = (tmp_path / "node0").glob("*/results.json")
    assert not (tmp_path / "node1").exists() or not list((tmp_path / "node1").glob("*/results.json"))
    res = json.loads(results.read_text())
    assert res["world_size"] == 2 and res["nnodes"] == 2
    final = res["replica_param_sha256"]["final"]
    assert len(final) == 2 and final[0] == final[1], "the two nodes ended with different weights"
    assert res["history"][-1]["val_loss"] < res["history"][0]["val_loss"]
