"""One command run in a bubblewrap sandbox, with limits, its output bounded.

What the sandbox sees: the system's programs and libraries, this Python and the folders
it imports from, read-only; the binds the caller names, read-only; its own ``/tmp``
(a bounded tmpfs, its only writable place); its own ``/proc`` (its own processes only),
its own network namespace (a loopback of its own: its ranks talk to each other, nothing
reaches the host's 127.0.0.1 or anything else), and its own hostname and IPC. The folders
named in ``hidden`` get an empty tmpfs on top wherever a bind would show them.

Limits (``prlimit``, per process): address space, CPU seconds, processes (of its uid),
file size, no core dumps. The wall-clock limit and the output bound are the grader's:
past ``timeout_s`` the sandbox is killed (``--die-with-parent`` and the PID namespace
take every process in it along, detached sessions included); past ``output_bytes`` the
rest of the output is read and dropped. Run as root, the command also runs under a uid of
its own (``setpriv``), with no capabilities.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from distkit.errors import DistkitError

FIRST_UID, UIDS = 61000, 1000  # the sandboxes' uids when run as root: one per sandbox running


@dataclass
class Limits:
    timeout_s: float = 300.0
    memory_mb: int = 4096      # address space of each process (torch maps about 1.5 GB)
    processes: int = 512       # threads count: torch and gloo start several per rank
    file_mb: int = 64
    tmp_mb: int = 512
    output_bytes: int = 1 << 20
    records_bytes: int = 16 << 20  # what comes back on the grader's pipe: records, or a check's data


@dataclass
class Outcome:
    returncode: int | None
    output: str
    records: bytes
    seconds: float
    timed_out: bool
    output_cut: bool
    left_behind: int           # processes of the sandbox's uid found alive after it ended
    uid: int | None


def require_bwrap() -> str:
    """The path of ``bwrap``, or a one-line refusal naming the fix."""
    found = shutil.which("bwrap")
    if not found:
        raise DistkitError("distkit grade runs each submission in a bubblewrap sandbox, and bwrap is "
                           "not installed: sudo apt-get install bubblewrap, then run it again")
    probe = subprocess.run([found, "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid",
                            *([] if os.geteuid() == 0 else ["--unshare-user"]), "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        raise DistkitError(f"bwrap cannot make a sandbox here ({probe.stderr.strip()[:200]}): allow "
                           "user namespaces (sysctl kernel.unprivileged_userns_clone=1) or run as root")
    return found


def python_paths() -> list[Path]:
    """The folders this Python imports from (the venv, the standard library, the kit's
    sources), without the current folder."""
    paths = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix),
             Path(os.path.realpath(sys.executable)).parent}
    cwd = Path.cwd().resolve()
    for entry in sys.path:
        if entry and Path(entry).is_dir() and Path(entry).resolve() != cwd:
            paths.add(Path(entry).resolve())
    return sorted(p for p in paths if not any(q != p and q in p.parents for q in paths))


def command(inside: list[str], binds: list[tuple[Path, str]], hidden: list[Path], env: dict,
            limits: Limits, uid: int | None) -> list[str]:
    """The bwrap command line that runs ``inside`` with these binds, hidden folders and limits."""
    cmd = [require_bwrap(), "--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-pid",
           "--unshare-net", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "grader"]
    if os.geteuid() != 0:
        cmd.append("--unshare-user")
    for system in ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/lib32"):
        if os.path.islink(system):
            cmd += ["--symlink", os.readlink(system), system]
        elif os.path.isdir(system):
            cmd += ["--ro-bind", system, system]
    cmd += ["--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp",
            "--perms", "1777", "--size", str(limits.tmp_mb << 20), "--tmpfs", "/dev/shm"]
    shown = [p for p in python_paths() if not str(p).startswith(("/usr/", "/etc/"))]
    targets = [Path(t) for t in [*map(str, shown), *(t for _, t in binds)]]
    for parent in sorted({str(a) for t in targets for a in t.parents if str(a) != "/"}):
        cmd += ["--perms", "0755", "--dir", parent]  # traversable by the sandbox's uid
    for path in shown:
        cmd += ["--ro-bind", str(path), str(path)]
    for source, target in binds:
        cmd += ["--ro-bind", str(source), target]
    for folder in hidden:
        if any(folder == p or p in folder.parents for p in shown + [Path("/usr"), Path("/etc")]):
            cmd += ["--tmpfs", str(folder)]
    cmd += ["--chdir", "/tmp", "--clearenv"]
    for name, value in env.items():
        cmd += ["--setenv", name, str(value)]
    cmd += ["--", "prlimit", f"--as={limits.memory_mb << 20}", f"--cpu={int(limits.timeout_s) + 5}",
            f"--nproc={limits.processes}", f"--fsize={limits.file_mb << 20}", "--core=0", "--"]
    if uid is not None:
        cmd += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-all", "--no-new-privs", "--"]
    return cmd + inside


def run(inside: list[str], binds, hidden, env: dict, payload: bytes, limits: Limits,
        slot: int = 0) -> Outcome:
    """Run ``inside`` in a sandbox. ``payload`` is readable inside on one pipe, and what the
    command writes on the other comes back as ``records`` (their numbers are in
    ``$DISTKIT_GRADE_FDS``, "read,write")."""
    uid, lock = _claim_uid(slot) if os.geteuid() == 0 else (None, None)
    try:
        return _run(inside, binds, hidden, env, payload, limits, uid)
    finally:
        if lock is not None:
            os.close(lock)


def _claim_uid(slot: int) -> tuple:
    """A uid no other sandbox uses now (graders running side by side included): held by a
    lock on a file named for it, until the sandbox ends."""
    import fcntl
    import tempfile

    for uid in [FIRST_UID + (slot + i) % UIDS for i in range(UIDS)]:
        fd = os.open(os.path.join(tempfile.gettempdir(), f"distkit-grade-uid-{uid}.lock"),
                     os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        _kill_uid(uid)  # whatever a grader that was killed left under this uid
        return uid, fd
    raise DistkitError(f"all {UIDS} sandbox uids from {FIRST_UID} are in use: lower --jobs")


def _run(inside, binds, hidden, env, payload, limits, uid) -> Outcome:
    to_read, to_write = os.pipe()
    from_read, from_write = os.pipe()
    env = {**env, "DISTKIT_GRADE_FDS": f"{to_read},{from_write}"}
    started = time.monotonic()
    proc = subprocess.Popen(command(inside, binds, hidden, env, limits, uid), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            pass_fds=(to_read, from_write), start_new_session=True)
    os.close(to_read)
    os.close(from_write)
    output, records = _Reader(proc.stdout.fileno(), limits.output_bytes), _Reader(from_read, limits.records_bytes)
    threading.Thread(target=_write_all, args=(to_write, payload), daemon=True).start()
    try:
        proc.wait(timeout=limits.timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    seconds = time.monotonic() - started
    left = _kill_uid(uid) if uid is not None else 0
    output.join(), records.join()
    proc.stdout.close()
    os.close(from_read)
    return Outcome(proc.returncode, output.text(), bytes(records.data), seconds, timed_out,
                   output.cut, left, uid)


class _Reader(threading.Thread):
    """Reads a pipe to its end, keeping the first ``limit`` bytes."""

    def __init__(self, fd: int, limit: int):
        super().__init__(daemon=True)
        self.fd, self.limit, self.data, self.cut = fd, limit, bytearray(), False
        self.start()

    def run(self):
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            room = self.limit - len(self.data)
            self.data += chunk[:max(room, 0)]
            self.cut = self.cut or len(chunk) > room

    def join(self, timeout=10):
        super().join(timeout)

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


def _write_all(fd: int, payload: bytes) -> None:
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
    except OSError:
        pass  # the sandbox ended before reading it: reported by its missing records


def _kill_uid(uid: int) -> int:
    """SIGKILL every process of ``uid``; how many there were."""
    found = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            owner = entry.stat().st_uid
        except OSError:
            continue
        if owner == uid:
            found += 1
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                pass
    return found
