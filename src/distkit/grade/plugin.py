"""The pytest plugin ``distkit grade`` loads into the checks it runs in a sandbox
(``pytest -p distkit.grade.plugin``). It runs in the learner's process, so it trusts
nothing learnt after the learner's code could run:

- Before any exercise file is imported (at ``pytest_configure``) it reads, from a pipe the
  grader wrote and closed, two keys made for this run and the reference solutions (they
  are not on the sandbox's disk), then closes the pipe.
- It writes every verdict on a second pipe to the grader, each line signed (HMAC-SHA256):
  what earns marks (``collected N``, ``passed`` per check, ``done``) with one key, held
  only in the closures of hooks it registers (no module's globals); what costs marks
  (``failed``, ``tampered``, ``borrowed``) with the other, which the guards below need.
  The grader counts an exercise only when every collected check has a genuine ``passed``
  and nothing genuine says otherwise; an exit status, or lines the learner writes, count
  for nothing, and a line that does not verify voids the exercise.
- After each check it compares the check's modules (harness, conftest, the test module,
  ``pytest.fail``) with what they were before the check ran: a file that patched the
  check is reported ``tampered``.
- The reference solutions are loaded under names of their own, outside ``sys.modules``,
  and each of their functions notes who calls it: called from the learner's file (or
  from no check at all, e.g. a thread the learner started) it is reported ``borrowed``
  at once, on the pipe, where the learner cannot take it back. An audit hook does the
  same when the learner's lines ask Python for a frame (the check's locals) or for every
  object (``gc``).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import sys
import threading
import types

import pytest

FDS_ENV = "DISTKIT_GRADE_FDS"
MAX_DETAIL = 3000  # one os.write below PIPE_BUF (4096 bytes) is never interleaved


VERDICT_KINDS = ("collected", "passed", "done")      # what earns marks: signed with one key
AGAINST_KINDS = ("failed", "tampered", "borrowed")   # what costs them: signed with another


def _open_channel():
    """Read the keys and the references, close the grader's pipe; return the two emitters
    (each holds its key and the write end in its closure) and the references."""
    read_fd, write_fd = (int(x) for x in os.environ.pop(FDS_ENV).split(","))
    chunks = []
    while True:
        chunk = os.read(read_fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_fd)
    given = json.loads(b"".join(chunks))
    write, new_mac, sha256 = os.write, hmac.new, hashlib.sha256

    def emitter(key: bytes, kinds: tuple):
        def emit(kind: str, nodeid: str = "", detail: str = "") -> None:
            if kind not in kinds:
                raise ValueError(f"{kind} is not for this emitter")
            text = " ".join(str(detail).split("\t"))[:MAX_DETAIL].replace("\\", "\\\\").replace("\n", "\\n")
            line = f"{kind}\t{nodeid}\t{text}"
            write(write_fd, f"{line}\t{new_mac(key, line.encode(), sha256).hexdigest()}\n".encode())
        return emit

    verdict_key, against_key = (bytes.fromhex(k) for k in given["keys"])
    return emitter(verdict_key, VERDICT_KINDS), emitter(against_key, AGAINST_KINDS), given["references"]


def sign(key: bytes, line: str) -> str:
    """The grader's side of ``emit``: the MAC a genuine line carries."""
    return hmac.new(key, line.encode(), hashlib.sha256).hexdigest()


class _State:
    against = None   # the emitter of records that cost the learner: harmless in their hands
    references: dict = {}
    current = ""
    snapshot: dict = {}
    reference_cache: dict = {}


def pytest_configure(config):
    if FDS_ENV in os.environ and _State.against is None:
        verdicts, _State.against, _State.references = _open_channel()
        # The emitter of what earns marks lives only in these hooks' closures, in no
        # module's globals, where an exercise file could import it.
        config.pluginmanager.register(_verdict_hooks(verdicts), "distkit-grade-verdicts")


def _verdict_hooks(emit) -> types.SimpleNamespace:
    def pytest_collection_finish(session):
        import harness

        harness.REFERENCE_SOURCE = _load_reference
        _watch_memory(harness._in_exercise_file)
        modules = [harness, sys.modules[__name__]] + [m for n, m in sys.modules.items()
                                                       if n == "conftest" or n.endswith(".conftest")]
        modules += list({id(item.module): item.module for item in session.items}.values())
        _State.snapshot = {m.__name__: (m, _fingerprint(m)) for m in modules}
        _State.snapshot["pytest"] = (pytest, _fingerprint(pytest, ("fail", "skip", "raises", "approx")))
        emit("collected", "", str(len(session.items)))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(item):
        _State.current = item.nodeid
        try:
            result = yield
        except BaseException as error:
            _tampered(item)
            _State.against("failed", item.nodeid, _message(error))
            raise
        if _tampered(item):
            pytest.fail("the file changed the check while it ran: no marks", pytrace=False)
        emit("passed", item.nodeid)
        return result

    def pytest_sessionfinish(session, exitstatus):
        emit("done", "", str(int(exitstatus)))

    return types.SimpleNamespace(pytest_collection_finish=pytest_collection_finish,
                                 pytest_runtest_call=pytest_runtest_call,
                                 pytest_sessionfinish=pytest_sessionfinish)


def _tampered(item) -> bool:
    changed = _changed()
    if changed:
        _State.against("tampered", item.nodeid, f"the file changed the check while it ran ({changed})")
    return bool(changed)


def _message(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text if type(error).__name__ in ("Failed", "Skipped") else f"{type(error).__name__}: {text}"


def _fingerprint(module, names=None) -> dict:
    return {name: (value, getattr(value, "__code__", None)) for name, value in list(vars(module).items())
            if names is None or name in names}


def _changed() -> str:
    """'' when the check's modules are as they were, else the first name that changed."""
    for name, (module, before) in _State.snapshot.items():
        names = tuple(before) if name == "pytest" else None
        now = _fingerprint(module, names)
        for attr in set(before) | set(now):
            old, new = before.get(attr, (None, None)), now.get(attr, (None, None))
            if old[0] is not new[0] or old[1] is not new[1]:
                return f"{name}.{attr}"
    return ""


def _load_reference(number: str) -> types.ModuleType:
    """The reference of exercise ``number`` from the grader's pipe, once per process."""
    cache = _State.reference_cache
    if number in cache:
        return cache[number]
    import harness

    name = f"distkit_reference_{number}_{secrets.token_hex(8)}"
    module = types.ModuleType(name)
    module.__file__ = f"<reference {number}>"
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    try:
        exec(compile(_State.references[number], module.__file__, "exec"), module.__dict__)
    finally:
        del sys.modules[name]
    checks = str(harness.EXERCISES_DIR / "checks")
    for attr, value in list(vars(module).items()):
        if isinstance(value, types.FunctionType) and value.__module__ == name:
            setattr(module, attr, _guarded(value, checks, harness._in_exercise_file))
    cache[number] = module
    return module


# Python's audit events that hand out frames or every object: how code finds what the
# check holds (its frames' locals, the reference's module).
_WATCHED = {"sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile", "gc.get_objects",
            "gc.get_referrers", "gc.get_referents"}
_FRAME_ATTRIBUTES = {"tb_frame", "gi_frame", "cr_frame", "ag_frame"}


def _watch_memory(in_learner_file) -> None:
    """An audit hook (which no Python code can remove): the learner's own lines (or
    ``inspect``'s, called by them) asking for a frame or for every object are reported
    ``borrowed`` and refused. Called from a library, or from the check, it is let through."""
    emit, busy = _State.against, threading.local()

    def hook(event, args):
        if event not in _WATCHED and not (event == "object.__getattr__" and args[1] in _FRAME_ATTRIBUTES):
            return
        if getattr(busy, "on", False):
            return
        busy.on = True
        try:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.endswith("inspect.py"):
                frame = frame.f_back
            if frame is None or not in_learner_file(frame.f_code.co_filename):
                return
        finally:
            busy.on = False
        emit("borrowed", _State.current, f"the learner's code looked into the check's memory ({event})")
        raise RuntimeError("the check's memory is not yours to read")

    sys.addaudithook(hook)


def _guarded(function, checks_dir: str, in_learner_file):
    emit = _State.against

    def guarded(*args, **kwargs):
        frame = sys._getframe(1)
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename.startswith(checks_dir):
                break  # the check called it: the way it is meant to be used
            if in_learner_file(filename):
                frame = None
                break
            frame = frame.f_back
        if frame is None:
            emit("borrowed", _State.current, f"the learner's code called the reference's {function.__name__}()")
            raise RuntimeError("the reference solution is not yours to call")
        return function(*args, **kwargs)

    guarded.__name__, guarded.__doc__ = function.__name__, function.__doc__
    return guarded
