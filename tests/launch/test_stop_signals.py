"""The stop signals of both launchers, one way (``distkit.launch.stop_signals``): drawn
signal (SIGTERM, SIGHUP, SIGUSR1, SIGINT), launcher (``distkit train``'s spawned ranks,
``distkit launch SCRIPT``) and moment (as soon as the launcher's handlers are in, before
its ranks run; while they run; again while they already stop).

The launcher runs in the process of a notebook-like caller (``CALLER``): a Python process
with its own handlers for every one of those signals (its SIGINT raises
``KeyboardInterrupt``, as a kernel's does), which calls the command line's ``main`` in
process and sends the signal to itself, a real signal, at the drawn moment. Each case
asserts: the exit status and the one ``distkit:`` line are the ones docs/failures.md,
docs/launch.md and docs/resume.md give; no process the launch started is left when it
returns; the caller's own handlers are back. Each case prints its seed line
(``DISTKIT_STOP_SEED=<n>`` replays the draw, ``DISTKIT_STOP_CASES`` sets how many).
"""
from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, Phase, given, note, seed, settings
from hypothesis import strategies as st

from support import subprocess_env, within_seconds
from distkit.host.facts import process_alive

SEED = int(os.environ.get("DISTKIT_STOP_SEED") or random.randrange(2 ** 32))
QUICK_CASES, FULL_CASES = 3, 12
print(f"test_stop_signals: DISTKIT_STOP_SEED={SEED}")

# A rank of `distkit launch`: stops slowly (1.5 s) on SIGTERM and SIGINT, so that a second
# signal lands while it stops; ends by itself after LIFE_S (a signal it never gets).
LIFE_S = 12
SCRIPT = f'''
import os, signal, sys, time
def leave(signum, frame):
    time.sleep(1.5)
    sys.exit(128 + signum)
signal.signal(signal.SIGTERM, leave)
signal.signal(signal.SIGINT, leave)
with open(f"pid{{os.environ['RANK']}}.tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(f"pid{{os.environ['RANK']}}.tmp", f"pid{{os.environ['RANK']}}")
time.sleep({LIFE_S})
'''

CALLER = r'''
import glob, json, os, signal, sys, threading, time
from distkit.commands import main
from distkit.host.facts import process_tree

kind, name, moment, argv = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
sig = signal.Signals[name]
got = []  # what the caller's own handlers saw


def own(signum, frame):
    got.append(signum)


def own_interrupt(signum, frame):  # a notebook kernel's: Ctrl-C raises KeyboardInterrupt
    got.append(signum)
    raise KeyboardInterrupt


mine = {signal.SIGTERM: own, signal.SIGHUP: own, signal.SIGUSR1: own, signal.SIGINT: own_interrupt}
for signum, handler in mine.items():
    signal.signal(signum, handler)
ranks = set()


def ranks_run() -> bool:
    ranks.update(process_tree(os.getpid()))
    if kind == "launch":
        return len(glob.glob("pid?")) == 2
    return bool(glob.glob("out/*/checkpoints/*.pt"))  # training has reached an iteration


def send() -> None:
    while signal.getsignal(signal.SIGTERM) is own:  # the launcher's handlers are not in yet
        time.sleep(0.001)
    while moment != "starting" and not ranks_run():
        time.sleep(0.05)
    os.kill(os.getpid(), sig)
    if moment == "stopping":
        time.sleep(0.1)
        os.kill(os.getpid(), sig)


sender = threading.Thread(target=send, daemon=True)
sender.start()
try:
    main(argv)
except SystemExit as e:
    code = e.code
except BaseException as e:  # nothing else may leave the command: its repr fails the case
    code = repr(e)
left = process_tree(os.getpid())
restored = [signal.Signals(s).name for s, h in mine.items() if signal.getsignal(s) is not h]
try:
    sender.join(5)  # a second signal after the launch is the caller's own
except KeyboardInterrupt:
    pass
print(json.dumps({"code": code, "left": left, "not_restored": restored, "ranks": sorted(ranks),
                  "caller_got": got}), flush=True)
'''

TRAIN = ["train", "--nproc-per-node", "2", "--backend", "gloo", "--epochs", "200",
         "--batch-size", "128", "--checkpoint-every", "1", "--no-progress", "--output-dir", "out"]
LAUNCH = ["launch", "--nproc-per-node", "2", "--backend", "gloo", "--grace", "4", "script.py"]


def expected(kind: str, sig: signal.Signals) -> tuple[int, str | None]:
    """(exit status, the one ``distkit:`` line as a regular expression) the docs give."""
    if kind == "launch":
        if sig == signal.SIGINT:
            return 130, (r"distkit: interrupted: forwarded Ctrl-C \(SIGINT\) to [0-2] rank\(s\) "
                         r"of script\.py; every rank has ended")
        if sig == signal.SIGUSR1:  # not one distkit launch takes: the caller's own handler has it
            return 0, None
        what = "it" if sig == signal.SIGTERM else "SIGTERM"
        return 143, rf"distkit: got {sig.name}: forwarded {what} to [0-2] rank\(s\) of script\.py; every rank has ended"
    if sig == signal.SIGINT:
        return 130, (r"distkit: interrupted: stopped [0-2] worker process\(es\); (resume from the last "
                     r"complete checkpoint with --resume-from \S+|no checkpoint had been written yet.*)")
    return 128 + sig, (rf"distkit: stopped by {sig.name} (at iteration \d+ \(epoch \d+\); checkpoint: (\S+); "
                       r"resume with: .* --resume-from \2|before training reached an iteration it could "
                       r"stop at .*; no checkpoint was written)")


def run_case(kind: str, sig: signal.Signals, moment: str, folder) -> None:
    (folder / "script.py").write_text(SCRIPT)
    (folder / "caller.py").write_text(CALLER)
    env = {k: v for k, v in subprocess_env().items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    argv = TRAIN if kind == "train" else LAUNCH
    caller = subprocess.run([sys.executable, "caller.py", kind, sig.name, moment, json.dumps(argv)],
                            cwd=folder, env=env, capture_output=True, text=True, check=False,
                            timeout=within_seconds(120), start_new_session=True)
    said = f"{kind} {sig.name} {moment}:\n{caller.stdout}\n{caller.stderr}"
    report = json.loads(caller.stdout.strip().splitlines()[-1])
    code, line = expected(kind, sig)
    lines = [ln for ln in caller.stderr.splitlines() if ln.startswith("distkit:")]
    print(f"{kind} {sig.name} {moment}: exit {report['code']}, {lines}")
    assert report["code"] == code, said
    if line is None:
        assert lines == [] and report["caller_got"][:1] == [sig], said
    else:
        assert len(lines) == 1 and re.fullmatch(line, lines[0]), said
    assert report["left"] == [], f"left behind: {said}"
    assert report["not_restored"] == [], f"the caller's handlers not restored: {said}"
    pids = [int(p.read_text()) for p in folder.glob("pid?")] + report["ranks"]
    assert not [p for p in pids if process_alive(p)], said


CASES = st.tuples(st.sampled_from(["train", "launch"]),
                  st.sampled_from([signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGINT]),
                  st.sampled_from(["starting", "running", "stopping"]))


def _settings(cases: int):
    # A case costs seconds of processes: a failing one is reported as drawn, not shrunk.
    return settings(max_examples=cases, deadline=None, database=None, print_blob=True,
                    phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.mark.timeout(900)
@seed(SEED)
@_settings(QUICK_CASES)
@given(case=CASES)
def test_a_stop_signal_ends_every_rank_with_the_documented_line(case, tmp_path_factory):
    note(f"replay: DISTKIT_STOP_SEED={SEED} pytest tests/launch/test_stop_signals.py")
    run_case(*case, tmp_path_factory.mktemp("stop"))


@pytest.mark.slow
@pytest.mark.timeout(3600)
@seed(SEED)
@_settings(int(os.environ.get("DISTKIT_STOP_CASES", FULL_CASES)))
@given(case=CASES)
def test_many_stop_signals_end_every_rank_with_the_documented_line(case, tmp_path_factory):
    note(f"replay: DISTKIT_STOP_SEED={SEED} pytest tests/launch/test_stop_signals.py -m slow")
    run_case(*case, tmp_path_factory.mktemp("stop"))


# A Ctrl-C whose KeyboardInterrupt Python drops: the handler runs inside a fork's hook in the
# parent (logging registers one; a launcher that forks its ranks runs them), where an
# exception cannot propagate. The launcher must still get it, not wait for the ranks' end.
DROPPED = r'''
import os, signal, sys, time
from distkit.launch.stop_signals import TRAINING, StopSignals


def hook():
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(1000):  # the handler runs here, in the hook: what it raises is dropped
        pass


signal.signal(signal.SIGINT, signal.default_int_handler)  # not ignored, as a terminal's is not
os.register_at_fork(after_in_parent=hook)
with StopSignals(lambda: [], TRAINING) as stop:
    started = time.monotonic()
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        time.sleep(10)
        print("lost", flush=True)
    except KeyboardInterrupt:
        stop.interrupt()
        print(f"taken after {time.monotonic() - started:.1f} s", flush=True)
print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, flush=True)
'''


def test_a_ctrl_c_python_drops_in_a_fork_hook_is_asked_again_until_the_launcher_takes_it(tmp_path):
    (tmp_path / "dropped.py").write_text(DROPPED)
    done = subprocess.run([sys.executable, "dropped.py"], cwd=tmp_path, env=subprocess_env(),
                          capture_output=True, text=True, timeout=within_seconds(60), check=False)
    said = f"{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, said
    assert "Exception ignored" in done.stderr, f"the first KeyboardInterrupt was not dropped: {said}"
    assert re.fullmatch(r"taken after \d+\.\d s\nTrue\n", done.stdout), said
