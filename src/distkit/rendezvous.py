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
  one line saying so, within ``--timeout``.

:func:`wait_for_master` is called by the launcher of every node but node 0, before it
spawns; node 0 says once that it waits for the others (:func:`node0_waiting_line`).
"""
from __future__ import annotations

import errno
import os
import socket
import sys
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


def _store_client(host: str, port: int, timeout_s: float, result_fd: int) -> None:
    """In a forked child: a torch store client asks the store for one key; writes ``ok``
    to ``result_fd`` if the store answered (quietly: torch's C++ warnings to /dev/null)."""
    from datetime import timedelta

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        import torch.distributed as dist

        client = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))
        client.check(["distkit-probe"])
        os.write(result_fd, b"ok")
    except BaseException:
        os.write(result_fd, b"error")


def answers_as_store(host: str, port: int, timeout_s: float) -> bool:
    """True if ``host:port`` answers as a torch.distributed TCPStore within ``timeout_s``.
    The client runs in a forked child that is killed at the deadline: against a program
    that accepts the connection and never replies, torch's client waits past its timeout."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            os.close(read_fd)
            _store_client(host, port, timeout_s, write_fd)
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    deadline = time.monotonic() + timeout_s + 2
    answer = b""
    try:
        while time.monotonic() < deadline:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return False
        os.set_blocking(read_fd, False)
        try:
            answer = os.read(read_fd, 16)
        except BlockingIOError:
            pass
    finally:
        os.close(read_fd)
    return answer == b"ok"


def wait_for_master(host: str, port: int, timeout_s: float, node_rank: int, say=None) -> None:
    """Wait, at most ``timeout_s``, until ``host:port`` answers as a torch store; say once
    what this node waits for if it is not there at once; raise a one-line DistkitError
    naming the cause and the fix when it gives up."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    deadline = time.monotonic() + timeout_s
    where = f"--master-addr {host} --master-port {port}"
    said, last = False, None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        last = reach_port(host, port, min(3.0, remaining))
        if last is None:
            if answers_as_store(host, port, max(1.0, min(10.0, deadline - time.monotonic()))):
                return
            raise DistkitError(
                f"node {node_rank}: {host}:{port} accepts connections but does not answer as a "
                "torch.distributed store: the port is held by another program, not this run's "
                f"master: pick a free --master-port, the same on every node ({where} now)")
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


def node0_waiting_line(nnodes: int, host: str, port: int, timeout_s: float) -> str:
    """What node 0 says before its processes wait at the rendezvous for the others."""
    return (f"distkit: node 0 of {nnodes}: master at {host}:{port}; the run starts when all "
            f"{nnodes} nodes have joined (waiting up to --timeout {timeout_s:g} s)")
