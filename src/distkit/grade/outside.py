"""Verdicts decided outside the learner's process, for the checks made of two halves: a
check module that defines ``PARTS``, ``collect(part, whos, seed)`` (run answers, return
plain data) and ``judge(part, got, expected, seed)`` (raise the learner's message when the
data is wrong); ``exercises/checks/harness.py`` describes them.

- In the sandbox, ``python -m distkit.grade.outside CHECKS NN SEED`` collects the learner's
  data, part after part, and writes it (``torch.save``) on the grader's pipe. It stops at
  the first part the learner's code fails, and sends that failure's message with the data.
  The reference solution is never in that sandbox.
- In a process of its own, where no learner's file is, the same command with
  ``--reference --out FILE`` collects the reference's data on the same seed.
- In the grader's process, which never imports a learner's file, :func:`verdict` loads both
  (``torch.load(weights_only=True)``: tensors, numbers, strings and containers, never an
  object of the learner's or code) and calls the check's ``judge`` on each part.

What the learner's process says (its exit status, what it prints, what it patches) cannot
pass a part: only data that the check's judge accepts against the reference's does.
"""
from __future__ import annotations

import argparse
import importlib.util
import io
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType

from distkit.errors import DistkitError

MAX_MESSAGE = 3000
# A learner's data may be this much larger than the reference's: a wrong answer's is about
# the same size, and the judges' plain Python loops stay quick on data this small.
MAX_DATA_FACTOR, MIN_DATA_CAP = 4, 16 << 10

_IMPORTING = threading.Lock()


def check_module(checks: Path, number: str) -> ModuleType:
    """The check of exercise ``number``, imported in this process (the kit's own code), with
    the harness of its own folder."""
    found = sorted(Path(checks).glob(f"test_{number}_*.py"))
    if not found:
        raise DistkitError(f"no check test_{number}_*.py in {checks}: give --dir the kit's exercises/")
    name = f"distkit_check_{number}"
    with _IMPORTING:  # the grader's threads: a module is in sys.modules before it has run
        if name in sys.modules and sys.modules[name].__file__ == str(found[0]):
            return sys.modules[name]
        harness = _harness_of(Path(checks))
        before = sys.modules.get("harness")
        sys.modules["harness"] = harness  # the check's `import harness` finds its folder's
        try:
            return _imported(found[0], name)
        finally:
            if before is None:
                del sys.modules["harness"]
            else:
                sys.modules["harness"] = before


def _harness_of(checks: Path) -> ModuleType:
    """``checks/harness.py``: the module named ``harness`` when it is that file (a test that
    imports the kit's checks catches that harness's failures), else a module of its own name,
    so that another folder's harness never takes the name from the rest of the process."""
    path = (checks / "harness.py").resolve()
    loaded = sys.modules.get("harness")
    if loaded is not None and Path(loaded.__file__).resolve() == path:
        return loaded
    name = f"distkit_harness_{abs(hash(str(path))):x}"
    return sys.modules[name] if name in sys.modules else _imported(path, name)


def _imported(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def judged_outside(check: ModuleType) -> bool:
    return all(hasattr(check, name) for name in ("PARTS", "collect", "judge"))


def collect_all(check: ModuleType, who: str, seed: int) -> dict:
    """``{"parts": {part: data of who}, "failure": the first failure's message or None}``."""
    harness = check.harness
    parts, failure = {}, None
    for part in check.PARTS:
        try:
            parts[part] = check.collect(part, (who,), seed)[who]
        except harness.ExerciseFailure as error:
            failure = str(error)
        except NotImplementedError as error:
            failure = harness.not_solved_message(error)
        except Exception as error:  # noqa: BLE001 - the learner's bug is their message, not a crash
            failure = f"{type(error).__name__}: {error}"
        if failure is not None:
            break
    return {"parts": parts, "failure": None if failure is None else failure[:MAX_MESSAGE]}


def to_bytes(data: dict) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(data, buffer)
    return buffer.getvalue()


def from_bytes(raw: bytes) -> dict:
    import torch

    data = io.BytesIO(raw)
    return torch.load(data, weights_only=True)


def reference_data(checks: Path, number: str, seed: int, timeout_s: float, out: Path) -> bytes:
    """The reference's data for ``seed``, collected in a process of its own."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DISTKIT_EXERCISES": "solutions"}
    command = [sys.executable, "-m", "distkit.grade.outside", str(checks), number, str(seed),
               "--reference", "--out", str(out)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        raise DistkitError(f"the reference of {number} took over {timeout_s:.0f} s: raise --timeout") from None
    if proc.returncode != 0 or not out.exists():
        raise DistkitError(f"the reference of {number} could not be run ({proc.stderr.strip()[-300:]}): "
                           "check the kit with distkit check --solutions")
    data = out.read_bytes()
    failure = from_bytes(data)["failure"]
    if failure:
        raise DistkitError(f"the reference of {number} fails its own check ({failure[:300]}): "
                           "check the kit with distkit check --solutions")
    return data


def verdict(check: ModuleType, got: bytes, expected: bytes, seed: int) -> tuple:
    """``(status, message)``: each part of the learner's data judged against the reference's."""
    failure_type = check.harness.ExerciseFailure
    reference = from_bytes(expected)["parts"]
    cap = max(MIN_DATA_CAP, MAX_DATA_FACTOR * len(expected))
    if len(got) > cap:
        return "failed", (f"the check's data came back {len(got) >> 10} KB long, over the {cap >> 10} KB "
                          "it can be: no marks")
    try:
        data = from_bytes(got)
        parts, failure = data["parts"], data["failure"]
        assert isinstance(parts, dict) and (failure is None or isinstance(failure, str))
    except Exception:  # noqa: BLE001 - anything but the collector's own data earns nothing
        return "no verdict", ("the check's data never came back whole: the file ended the process, "
                              "or wrote on the grader's pipe itself")
    for done, part in enumerate(check.PARTS):
        if part not in parts:
            if failure:
                return "failed", failure
            return "no verdict", f"the check stopped before it finished ({done} of {len(check.PARTS)} parts)"
        try:
            check.judge(part, parts[part], reference[part], seed)
        except failure_type as error:
            return "failed", str(error)
        except Exception as error:  # noqa: BLE001 - data the check's code never makes
            return "failed", (f"{part}: the data is not what the check collects ({type(error).__name__}: "
                              f"{str(error)[:200]}): no marks")
    return "passed", f"all {len(check.PARTS)} parts passed, judged outside the sandbox"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m distkit.grade.outside",
                                description="collect one exercise's data for distkit grade")
    p.add_argument("checks")
    p.add_argument("number")
    p.add_argument("seed", type=int)
    p.add_argument("--reference", action="store_true", help="the reference's data, not the learner's")
    p.add_argument("--out", default=None, help="write it here (default: the grader's pipe)")
    args = p.parse_args(argv)
    check = check_module(Path(args.checks), args.number)
    who = check.harness.REFERENCE if args.reference else check.harness.LEARNER
    raw = to_bytes(collect_all(check, who, args.seed))
    if args.out:
        from distkit.host.files import write_whole

        write_whole(args.out, lambda f: f.write(raw), binary=True)
        return 0
    write_fd = int(os.environ["DISTKIT_GRADE_FDS"].split(",")[1])
    view = memoryview(raw)
    while view:
        view = view[os.write(write_fd, view):]
    return 0


if __name__ == "__main__":
    sys.exit(main())
