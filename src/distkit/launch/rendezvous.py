"""Every wait is bounded and said: reaching the master before a node's processes start.

A node other than node 0 starts its processes only once the master's port answers as a
torch.distributed store, within ``--timeout``. Before that check, torch's own client
waited in silence: on a port held by another program, for as long as that program lived
(its TCPStore client waits for a reply that never comes, past its own timeout); on an
address where no host answers, for minutes, then hundreds of lines of C++ frames. Here:

- nothing answers yet (refused, or no reply): one line says what this node waits for,
  and it keeps trying until ``--timeout``; node 0 may start later, within the timeout;
- given up: one line naming the cause (nothing listens there; no host answers) and the fix;
- something answers but is not a torch store (a web server, another program on the port):
  one line saying so, within ``--timeout``;
- a torch store that is not this run's master (another live distkit run, torchrun, any
  other torch job on the port): one line saying another run holds the port.

The launchers meet before any process group: node 0's launcher serves the run's store
(:func:`host_master_store`) and every other node's launcher joins it
(:func:`wait_for_master`) with its ``--nnodes`` and ``--nproc-per-node``. Nodes with
another ``--nproc-per-node`` compute different world sizes and would never form a group
(so the workers' comparison of settings, :mod:`distkit.train.agreement`, is never reached); here
each node stops in one line naming the flag and both values. The workers then use node
0's store as their rendezvous store (``TORCHELASTIC_USE_AGENT_STORE``, as torchrun's
workers use its agent's). Node 0 says once that it waits for the others
(:func:`node0_waiting_line`).
"""
from __future__ import annotations

import errno
import os
import socket
import time

from distkit.errors import DistkitError

RETRY_S = 0.5


def reach_port(host: str, port: int, timeout_s: float) -> str | None:
    """Try one TCP connection to ``host:port`` within ``timeout_s``: None if it connects,
    else ``"refused"`` (nothing listens) or ``"no answer"`` (no host replied)."""
    try:
        with socket.create_connection((host, port), timeout=max(0.1, timeout_s)):
            return None
    except ConnectionRefusedError:
        return "refused"
    except OSError as e:
        if e.errno in (errno.ECONNREFUSED,):
            return "refused"
        return "no answer"


PREFIX = "distkit/launch/"
"""The keys the launchers of one run exchange in node 0's store, before any process group."""


def _progress(fd: int, what: str) -> None:
    os.write(fd, (what + "\n").encode())


def _join_as_node(result_fd: int, host: str, port: int, timeout_s: float, mine: dict | None) -> None:
    """In a forked child (torch's C++ warnings to /dev/null): reach the store at
    ``host:port`` and, given ``mine`` (this node's ``{"node", "nnodes", "nproc_per_node"}``),
    join node 0's launcher there. Writes what it got to, one word a line, to ``result_fd``:
    ``store`` (it answered as a torch store), then ``foreign`` (a store with no distkit
    launch: another job's), ``formed`` / ``taken`` (another distkit run, already formed, or
    already with a node of this number), ``joined`` (registered), then the verdict as JSON."""
    from datetime import timedelta

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    import json

    import torch.distributed as dist

    deadline = time.monotonic() + timeout_s
    client = dist.TCPStore(host, port, None, False, timedelta(seconds=max(1.0, timeout_s)),
                           wait_for_workers=False)
    client.check([PREFIX + "probe"])
    _progress(result_fd, "store")
    if mine is None:
        return
    # node 0's launcher sets "run" as soon as its store listens; a store without it for
    # a few seconds is not a distkit node 0's (a single-node run's, torchrun's ...)
    until = min(deadline, time.monotonic() + 5.0)
    while not client.check([PREFIX + "run"]):
        if time.monotonic() >= until:
            _progress(result_fd, "foreign")
            return
        time.sleep(0.1)
    run = json.loads(client.get(PREFIX + "run"))
    if mine["node"] >= run["nnodes"]:  # node 0 waits for nodes 1 .. its nnodes - 1 only
        _progress(result_fd, json.dumps({"differ": layout_difference({0: run, mine["node"]: mine})}))
        return
    if client.check([PREFIX + "verdict"]):
        _progress(result_fd, "formed")  # that run has already started: it is not this one
        return
    if client.add(PREFIX + f"joined/{mine['node']}", 1) > 1:
        _progress(result_fd, "taken")  # that run already has a node of this number
        return
    client.set(PREFIX + f"node/{mine['node']}", json.dumps(mine))
    _progress(result_fd, "joined")
    while not client.check([PREFIX + "verdict"]):
        if time.monotonic() >= deadline:
            return
        time.sleep(0.1)
    _progress(result_fd, client.get(PREFIX + "verdict").decode())


def _in_child(target, timeout_s: float, *args) -> list[str]:
    """Run ``target(write_fd, *args)`` in a forked child killed after ``timeout_s``: a torch
    store client against a program that accepts connections and never replies waits past
    its own timeout. Returns the lines the child wrote."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            os.close(read_fd)
            target(write_fd, *args)
            code = 0
        except BaseException:
            pass
        finally:
            os._exit(code)
    os.close(write_fd)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.set_blocking(read_fd, False)
        data = b""
        while True:
            try:
                chunk = os.read(read_fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_fd)
    return data.decode(errors="replace").splitlines()


def wait_for_master(host: str, port: int, timeout_s: float, node_rank: int, say=None,
                    nnodes: int | None = None, nproc_per_node: int | None = None) -> None:
    """Wait, at most ``timeout_s``, until ``host:port`` answers as a torch store; say once
    what this node waits for if it is not there at once; raise a one-line DistkitError
    naming the cause and the fix when it gives up.

    Given ``nnodes`` and ``nproc_per_node``, join node 0's launcher there
    (:func:`host_master_store`): this node's layout is compared with node 0's before any
    process group forms, and a port held by another run is told apart from this run's
    master."""
    # on stdout, as node 0's waiting line: a status, not an error (stderr is for those)
    say = say or (lambda line: print(line, flush=True))
    deadline = time.monotonic() + timeout_s
    where = f"--master-addr {host} --master-port {port}"
    said, last = False, None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        last = reach_port(host, port, min(3.0, remaining))
        if last is None:
            mine = None if nnodes is None else {"node": node_rank, "nnodes": nnodes,
                                                "nproc_per_node": nproc_per_node}
            left = max(1.0, deadline - time.monotonic())
            got = _in_child(_join_as_node, left + 2, host, port, left, mine)
            _judge_join(got, host, port, timeout_s, node_rank, mine, where)
            return
        if not said:
            say(f"distkit: node {node_rank}: waiting up to --timeout {timeout_s:g} s for the master "
                f"(node 0) at {host}:{port} ({'nothing listens there yet' if last == 'refused' else 'no answer yet'})")
            said = True
        time.sleep(min(RETRY_S, max(0.0, deadline - time.monotonic())))
    if last == "refused":
        raise DistkitError(
            f"node {node_rank}: nothing listened at {host}:{port} within --timeout {timeout_s:g} s: "
            "start node 0 (--node-rank 0) within --timeout of the others, with the same "
            f"--master-port, and check {where}")
    raise DistkitError(
        f"node {node_rank}: no host answered at {host}:{port} within --timeout {timeout_s:g} s: "
        "pass as --master-addr the address of node 0 as this node reaches it, and check that "
        f"no firewall blocks port {port}")


def _judge_join(got: list, host, port, timeout_s, node_rank, mine, where) -> None:
    """What node N's child found at the master (:func:`_join_as_node`), as one line."""
    import json

    if "store" not in got:
        raise DistkitError(
            f"node {node_rank}: {host}:{port} accepts connections but does not answer as a "
            "torch.distributed store: the port is held by another program, not this run's "
            f"master: pick a free --master-port, the same on every node ({where} now)")
    if mine is None:
        return
    other_run = {
        "foreign": "a torch.distributed store that no distkit node 0 made: another job's "
                   "master, a single-node run or torchrun",
        "formed": "the master of another distkit run, already started",
        "taken": f"the master of another distkit run, which already has its node {node_rank}",
    }
    for word, what in other_run.items():
        if word in got:
            raise DistkitError(
                f"node {node_rank}: {host}:{port} is held by another run ({what}), not this run's "
                f"master: pass another --master-port, free on node 0 and the same on every node "
                f"(now {where})")
    verdict = next((line for line in got if line.startswith("{")), None)
    if verdict is None:
        raise DistkitError(
            f"node {node_rank}: joined the master at {host}:{port}, but node 0 did not start the "
            f"run within --timeout {timeout_s:g} s (not every node came): start all nodes "
            "within --timeout of each other, with the same --nnodes, --nproc-per-node, "
            "--master-addr and --master-port")
    verdict = json.loads(verdict)
    if verdict.get("differ"):
        raise DistkitError(f"node {node_rank}: {verdict['differ']}")


LAYOUT_FLAGS = (("nnodes", "--nnodes"), ("nproc_per_node", "--nproc-per-node"))


def layout_difference(nodes: dict) -> str | None:
    """The line body that says how the nodes' layouts (``{node: {"nnodes", "nproc_per_node"}}``,
    node 0 included) differ from node 0's, or None::

        >>> print(layout_difference({0: {"nnodes": 2, "nproc_per_node": 2},
        ...                          1: {"nnodes": 2, "nproc_per_node": 1}}))
        --nproc-per-node is 1 on node 1 and 2 on node 0; no process group was formed, nothing was trained: start every node with the same --nproc-per-node (node 0's is the reference)
    """
    reference = nodes[0]
    found, flags = [], []
    for node in sorted(nodes):
        for key, flag in LAYOUT_FLAGS:
            if nodes[node].get(key) != reference.get(key):
                found.append(f"{flag} is {nodes[node].get(key)} on node {node} and "
                             f"{reference.get(key)} on node 0")
                if flag not in flags:
                    flags.append(flag)
    if not found:
        return None
    return (f"{'; '.join(found[:3])}; no process group was formed, nothing was trained: start "
            f"every node with the same {' and '.join(flags)} (node 0's is the reference)")


def host_master_store(host: str, port: int, nnodes: int, nproc_per_node: int, timeout_s: float):
    """Node 0's launcher: serve the run's torch store at ``port`` and wait, at most
    ``timeout_s``, until every other node's launcher has joined (:func:`wait_for_master`)
    with the same ``--nnodes`` and ``--nproc-per-node``. Returns the store, to keep for the
    whole run: the workers of every node use it as their rendezvous store, as torchrun's
    workers use its agent's (``TORCHELASTIC_USE_AGENT_STORE``). Raises one line when the
    port is taken, a node does not come, or the layouts differ (every node gets the line).

    Why here and not in the workers: nodes started with another ``--nproc-per-node``
    compute different world sizes and never form a process group, so the settings the
    workers compare (:mod:`distkit.train.agreement`) never meet; each node only timed out,
    naming no flag."""
    import json
    from datetime import timedelta

    import torch.distributed as dist

    try:
        store = dist.TCPStore(host, port, None, True, timedelta(seconds=max(1.0, timeout_s)),
                              wait_for_workers=False)
    except Exception as e:  # noqa: BLE001 (torch's DistNetworkError: EADDRINUSE ...)
        raise DistkitError(
            f"node 0: cannot serve the master at port {port} ({str(e).splitlines()[0][:120]}): "
            "another program or run holds it: pass another --master-port, the same on every "
            "node") from None
    store.set(PREFIX + "run", json.dumps({"nnodes": nnodes, "nproc_per_node": nproc_per_node}))
    nodes = {0: {"node": 0, "nnodes": nnodes, "nproc_per_node": nproc_per_node}}
    deadline = time.monotonic() + timeout_s
    while len(nodes) < nnodes and time.monotonic() < deadline:
        for node in range(1, nnodes):
            if node not in nodes and store.check([PREFIX + f"node/{node}"]):
                nodes[node] = json.loads(store.get(PREFIX + f"node/{node}"))
        if layout_difference(nodes):  # no need to wait for the rest
            break
        time.sleep(0.1)
    differ = layout_difference(nodes)
    if differ is None and len(nodes) < nnodes:
        missing = ", ".join(str(n) for n in range(1, nnodes) if n not in nodes)
        raise DistkitError(
            f"node 0: not every node joined the run at {host}:{port} within --timeout "
            f"{timeout_s:g} s (node {missing} did not come): start all {nnodes} nodes within "
            "--timeout of each other, with the same --nnodes, --nproc-per-node, --master-addr "
            "and --master-port")
    store.set(PREFIX + "verdict", json.dumps({"differ": differ}))
    if differ:
        time.sleep(1.0)  # the other nodes read the verdict from this store before it closes
        raise DistkitError(f"node 0: {differ}")
    return store


def node0_waiting_line(nnodes: int, host: str, port: int, timeout_s: float) -> str:
    """What node 0 says before its processes wait at the rendezvous for the others."""
    return (f"distkit: node 0 of {nnodes}: master at {host}:{port}; the run starts when all "
            f"{nnodes} nodes have joined (waiting up to --timeout {timeout_s:g} s)")
