"""Two real hosts on one Linux machine: network namespaces joined by a veth pair.

Each host has its own network stack, its own address from the benchmarking range
198.18.0.0/15 (RFC 2544: never routed on the internet), nothing routed outside the
pair, and, through ``unshare --uts``, its own hostname that resolves to nothing, as on
many clusters and cloud VMs. A resolver configuration of its own (``/etc/netns/<name>/
resolv.conf``, which ``ip netns exec`` mounts) makes lookups fail at once instead of
waiting for a name server the namespace cannot reach. Needs root and ``ip``;
:func:`unavailable` says why not where it cannot run::

    with NamespaceHosts() as hosts:
        subprocess.run(hosts.command(0, ["hostname"]))   # host-0 ... in its own namespace
        hosts.cut()                                         # the link goes down
        hosts.mend()
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import weakref


def unavailable() -> str | None:
    """Why two namespace hosts cannot be made here, or None if they can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    missing = [tool for tool in ("ip", "unshare") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed"
    return None


def _remove(namespaces) -> None:
    for ns in namespaces:  # deleting a namespace deletes its end of the pair
        _ip("netns", "del", ns, check=False)
        shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


class NamespaceHosts:
    """Two hosts, ``host-0`` (198.18.N.1) and ``host-1`` (198.18.N.2), N picked per
    instance so that several pairs can exist at once."""

    def __init__(self, tag: str | None = None):
        tag = tag or f"{os.getpid() % 100000}"
        self.namespaces = [f"dkh{tag}x{i}" for i in (0, 1)]
        self.links = [f"dkv{tag}x{i}"[:15] for i in (0, 1)]
        subnet = 1 + int(tag) % 250 if tag.isdigit() else 77
        self.addresses = [f"198.18.{subnet}.{i + 1}" for i in (0, 1)]
        self.hostnames = ["host-0", "host-1"]

    def __enter__(self):
        why = unavailable()
        if why:
            raise RuntimeError(why)
        # removed at the latest when this object goes or the interpreter exits (a failed
        # notebook cell that never reaches close() leaves no namespaces behind)
        self._finalizer = weakref.finalize(self, _remove, list(self.namespaces))
        try:
            for ns in self.namespaces:
                _ip("netns", "add", ns)
                os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
                with open(f"/etc/netns/{ns}/resolv.conf", "w") as f:  # fail fast, nothing to ask
                    f.write("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
            _ip("link", "add", self.links[0], "type", "veth", "peer", "name", self.links[1])
            for ns, link, address in zip(self.namespaces, self.links, self.addresses):
                _ip("link", "set", link, "netns", ns)
                _ip("-n", ns, "addr", "add", f"{address}/24", "dev", link)
                _ip("-n", ns, "link", "set", link, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        _remove(self.namespaces)

    def command(self, host: int, argv: list) -> list:
        """``argv`` run on ``host`` (0 or 1): in its namespace, under its own hostname."""
        return ["ip", "netns", "exec", self.namespaces[host], "unshare", "--uts", "sh", "-c",
                f'hostname {self.hostnames[host]} && exec "$@"', "sh", *map(str, argv)]

    def cut(self) -> None:
        """The link between the hosts goes down (both ends lose their carrier)."""
        _ip("-n", self.namespaces[0], "link", "set", self.links[0], "down")

    def mend(self) -> None:
        _ip("-n", self.namespaces[0], "link", "set", self.links[0], "up")
