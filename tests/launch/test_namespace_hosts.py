"""Two real hosts: network namespaces on a veth pair (198.18.0.0/15, nothing routed
outside them), each with its own hostname that resolves to nothing. The unchanged
``torchrun --nnodes=2 ... -m distkit train`` on each trains with no hand-set interface
variable: every process binds gloo to the interface that routes to the master. Needs
root (``ip netns``); skipped with that reason elsewhere."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support import subprocess_env
from distkit.lessons.hosts import NamespaceHosts, unavailable

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")
PORT = 29400


@pytest.fixture
def hosts():
    with NamespaceHosts() as made:
        yield made


def on_host(hosts, host, code):
    """``python -c code`` on a namespace host; its stdout."""
    out = subprocess.run(hosts.command(host, [sys.executable, "-c", code]), env=subprocess_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def torchrun_on(hosts, host, *args, output_dir, timeout_s=30):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={host}",
           "--nproc_per_node=1", f"--master_addr={hosts.addresses[0]}", f"--master_port={PORT}",
           "--monitor-interval=0.5", "-m", "distkit", "train", "--no-progress",
           "--timeout", timeout_s, "--output-dir", output_dir, *args]
    env = subprocess_env()
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):  # no hand-set interface
        env.pop(name, None)
    return subprocess.Popen(hosts.command(host, cmd), env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_each_host_picks_the_interface_that_routes_to_the_master(hosts):
    code = (
        "import os\n"
        "from distkit.errors import DistkitError\n"
        "from distkit.host.facts import socket_interface\n"
        "from distkit.commands.doctor import network_interface\n"
        "import socket\n"
        f"print(socket.gethostname())\n"
        f"print(socket_interface('gloo', {hosts.addresses[0]!r})['interface'])\n"
        f"print(socket_interface('nccl', {hosts.addresses[0]!r})['variable'])\n"
        f"print(socket_interface('gloo', 'x', {{'GLOO_SOCKET_IFNAME': 'eth7'}})['set_by'])\n"
        "try:\n"
        "    socket_interface('gloo', '10.1.2.3')\n"
        "except DistkitError as e:\n"
        "    print(e)\n"
        f"print(network_interface({{'MASTER_ADDR': {hosts.addresses[0]!r}}}))\n")
    lines = on_host(hosts, 1, code).splitlines()
    assert lines[0] == "host-1"
    assert lines[1:4] == [hosts.links[1], "NCCL_SOCKET_IFNAME", "you"]
    assert lines[4] == (
        f"no network interface of this host routes to the master address '10.1.2.3' "
        f"(interfaces: lo (127.0.0.1), {hosts.links[1]} ({hosts.addresses[1]})): check the "
        "address, or set GLOO_SOCKET_IFNAME to the interface the other nodes reach this one on")
    # distkit doctor's line
    assert lines[5] == (f"GLOO_SOCKET_IFNAME={hosts.links[1]} ({hosts.addresses[1]}, routes to "
                        f"the master {hosts.addresses[0]}): what distkit sets on several nodes")
    # the hostname resolves to nothing, as on the clusters this is for
    assert subprocess.run(hosts.command(1, ["getent", "hosts", "host-1"])).returncode != 0


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_torchrun_on_two_namespace_hosts_trains_without_a_hand_set_interface(hosts, tmp_path):
    procs = [torchrun_on(hosts, h, "--epochs", 1, output_dir=tmp_path / "runs") for h in (0, 1)]
    try:
        outs = [p.communicate(timeout=360)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    assert not any("loopback address as fallback" in o for o in outs)
    (results,) = (tmp_path / "runs").glob("*/results.json")
    res = json.loads(results.read_text())
    assert res["world_size"] == 2 and res["nnodes"] == 2 and res["replicas_identical"]
    # the thread rule counts ranks per host: one rank on each of two differently named
    # hosts, so each takes all the cores it sees
    assert res["threads_per_process"] == len(os.sched_getaffinity(0))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_cut_link_ends_both_hosts_in_one_line_each_and_resume_ends_equal(hosts, tmp_path):
    """The link between the hosts goes down mid-run (``ip link set ... down``): each node
    ends within 2 x --timeout + 30 s with one distkit: line naming the node it lost and
    the last complete checkpoint, and no worker traceback. With the link back, both
    restart with --resume-from latest and end with the weights of an uninterrupted run
    (2 processes spawned on this host: the same world size, batches and arithmetic)."""
    import re
    import time

    import torch

    from distkit.checkpoint import saver as checkpoint
    from distkit.checkpoint.saver import load_checkpoint
    from distkit.lessons import failure

    timeout = 15
    train = ["--epochs", 2, "--checkpoint-every", 5, "--threads-per-process", 1]
    reference = subprocess.Popen(
        list(map(str, [sys.executable, "-m", "distkit", "train", "--nproc-per-node", 2,
                       "--no-progress", *train, "--output-dir", tmp_path / "ref"])),
        cwd=tmp_path, env=subprocess_env(),
        text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    runs = tmp_path / "runs"  # one output folder that both hosts see, as on a cluster
    procs = [torchrun_on(hosts, h, *train, output_dir=runs, timeout_s=timeout) for h in (0, 1)]
    try:
        failure.wait_for_checkpoint(runs, 10, timeout=300)
        hosts.cut()
        cut_at = time.monotonic()
        outs = [p.communicate(timeout=2 * timeout + 60)[0] for p in procs]
        took = time.monotonic() - cut_at
        hosts.mend()
        assert took < 2 * timeout + 30, f"{took:.0f} s"
        assert all(p.returncode != 0 for p in procs), outs
        newest = checkpoint.latest_checkpoint(runs)
        assert load_checkpoint(newest)["trainer"]["iteration"] < 46  # loadable, mid-run
        for node, out in enumerate(outs):
            ours = [ln for ln in out.splitlines() if ln.startswith("distkit: error:")]
            assert len(ours) == 1, out[-3000:]
            other = 1 - node
            assert re.match(rf"distkit: error: rank {node} \(local rank 0, node {node} of 2\) lost "
                            rf"node {other} \(rank {other}\): no answer within --timeout {timeout} s",
                            ours[0]), ours[0]
            assert ours[0].endswith(f"last complete checkpoint: {newest}"), ours[0]
            assert "[rank" not in out, out[-3000:]  # no worker traceback
            assert not re.search(r'File "[^"]*/distkit/(training|launch|failures)\.py"', out)

        procs = [torchrun_on(hosts, h, *train, "--resume-from", "latest", output_dir=runs,
                             timeout_s=timeout) for h in (0, 1)]
        outs = [p.communicate(timeout=300)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
        assert f"resuming from {newest}" in outs[0], outs[0][-2000:]
        ref_out = reference.communicate(timeout=300)[0]
        assert reference.returncode == 0, ref_out[-2000:]
    finally:
        for p in (*procs, reference):
            p.kill()
    final = {d: load_checkpoint(checkpoint.latest_checkpoint(tmp_path / d)) for d in ("runs", "ref")}
    assert final["runs"]["trainer"]["iteration"] == final["ref"]["trainer"]["iteration"] == 46
    a, b = final["runs"]["model"], final["ref"]["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
