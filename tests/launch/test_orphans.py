"""No orphans: whatever the launcher of ``distkit launch`` is sent (SIGKILL, SIGTERM,
SIGHUP) and whatever the script does (ignores SIGTERM, forks a child that ignores it,
starts one in a session of its own), every rank and everything it started ends within
the grace. The combinations are drawn (Hypothesis); each case prints its seed line
(``DISTKIT_ORPHAN_SEED=<n>`` replays the draw, ``DISTKIT_ORPHAN_CASES`` sets how many)."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, note, seed, settings
from hypothesis import strategies as st

from support import subprocess_env, within_seconds
from distkit.host.facts import process_alive

SEED = int(os.environ.get("DISTKIT_ORPHAN_SEED", random.randrange(2**32)))
CASES = int(os.environ.get("DISTKIT_ORPHAN_CASES", "4"))
GRACE_S = 2.0
print(f"test_orphans: DISTKIT_ORPHAN_SEED={SEED}")

STUBBORN = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)\n"
SCRIPT = f'''
import os, signal, subprocess, sys, time
behaviour, rank = sys.argv[1], os.environ["RANK"]
pids = [os.getpid()]
if behaviour == "ignores-sigterm":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif behaviour == "forks":
    child = os.fork()
    if child == 0:
        exec({STUBBORN!r})
    pids.append(child)
elif behaviour == "new-session":
    pids.append(subprocess.Popen([sys.executable, "-c", {STUBBORN!r}], start_new_session=True).pid)
with open(f"pids{{rank}}.tmp", "w") as f:
    f.write(" ".join(map(str, pids)))
os.replace(f"pids{{rank}}.tmp", f"pids{{rank}}")
while True:
    time.sleep(1)
'''


def _wait_for_pids(folder, timeout):
    paths = [folder / "pids0", folder / "pids1"]
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.2)
    return [int(pid) for p in paths for pid in p.read_text().split()]


@pytest.mark.slow
@pytest.mark.timeout(900)
@seed(SEED)
@settings(max_examples=CASES, deadline=None, database=None, print_blob=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(sig=st.sampled_from([signal.SIGKILL, signal.SIGTERM, signal.SIGHUP]),
       behaviour=st.sampled_from(["ignores-sigterm", "forks", "new-session"]))
def test_nothing_outlives_the_launcher(sig, behaviour, tmp_path_factory):
    note(f"replay: DISTKIT_ORPHAN_SEED={SEED} pytest tests/launch/test_orphans.py")
    folder = tmp_path_factory.mktemp("orphans")
    (folder / "script.py").write_text(SCRIPT)
    env = {k: v for k, v in subprocess_env().items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    launcher = subprocess.Popen([sys.executable, "-m", "distkit", "launch", "--nproc-per-node", "2",
                                 "--backend", "gloo", "--grace", str(GRACE_S), "script.py", behaviour],
                                cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    pids = []
    try:
        pids = _wait_for_pids(folder, within_seconds(60))
        launcher.send_signal(sig)
        _, err = launcher.communicate(timeout=within_seconds(30))
        deadline = time.monotonic() + GRACE_S + within_seconds(15)
        while any(process_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [p for p in pids if process_alive(p)]
        print(f"{sig.name} to the launcher, script {behaviour}: exit {launcher.returncode}, left {left}")
        assert not left, f"{sig.name} x {behaviour}: still running {left}; launcher said {err!r}"
        if sig == signal.SIGKILL:
            assert launcher.returncode == -signal.SIGKILL
        else:
            assert launcher.returncode == 143, err
            assert err.strip().splitlines() == [
                f"distkit: got {sig.name}: forwarded {'it' if sig == signal.SIGTERM else 'SIGTERM'} "
                "to 2 rank(s) of script.py; every rank has ended"], err
    finally:
        launcher.kill()
        for pid in pids:  # a failed case leaves nothing behind for the next one
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
