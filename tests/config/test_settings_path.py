"""Following a run's settings from ``distkit train`` to the first training step enters
each module of the kit at most twice (measured, not asserted by reading the code)."""
from __future__ import annotations

import collections
import os
import sys

import distkit
from distkit.config import Config

SRC = os.path.dirname(distkit.__file__)


def _module(code) -> str | None:
    path = code.co_filename
    if not path.startswith(SRC + os.sep):
        return None
    name = os.path.relpath(path, SRC)[:-3].replace(os.sep, ".")
    return "distkit" + ("" if name == "__init__" else "." + name.removesuffix(".__init__"))


def _task_code(task) -> set:
    """The code objects of the task's own functions (datasets, model, optimizer, ...):
    they receive the config by the Task contract, as inputs of the problem, as a
    course's task would; the kit's path for the settings runs around them."""
    from distkit.train.agreement import _functions

    import dataclasses

    codes = set()
    for field in dataclasses.fields(task):
        for fn in _functions(getattr(task, field.name)):
            code = getattr(fn, "__code__", None)
            if code is not None:
                codes.add(code)
    return codes


def settings_path(argv: list) -> list:
    """The modules the settings enter, in order, from ``distkit ARGV``'s main (in this
    process) to the first call of the kit's training step.

    Precisely: the chain is every call of a function defined in ``src/distkit`` whose
    arguments (its locals when called, ``self`` included) hold a :class:`Config`, but
    the task's own functions (:func:`_task_code`) and what they call. A module is
    *entered* when such a call's module is not the module of the innermost such call
    still on the stack (the call stack's innermost config-handling distkit module
    changes into it by a call); a return to a caller is not an entry. Each entry
    appends the module entered."""
    from distkit.commands import main
    from distkit.tasks import BUILTIN_TASKS

    skip = set().union(*(_task_code(t) for t in BUILTIN_TASKS.values()))
    stack, entries, state = [], [], {"done": False, "skipping": 0}

    def profile(frame, event, arg):
        if state["done"] or event not in ("call", "return"):
            return
        if event == "return":
            if stack:
                kind = stack.pop()
                if kind == "skip":
                    state["skipping"] -= 1
            return
        code = frame.f_code
        module = _module(code)
        if module == "distkit.train.training" and code.co_name in ("train_step", "own_step"):
            state["done"] = True  # the first training step: the path ends here
            return
        if code in skip:
            state["skipping"] += 1
            stack.append("skip")
            return
        handles = (module is not None and not state["skipping"]
                   and any(isinstance(v, Config) for v in frame.f_locals.values()))
        if handles:
            innermost = next((m for m in reversed(stack) if m not in (None, "skip")), None)
            if module != innermost:
                entries.append(module)
            stack.append(module)
        else:
            stack.append(None)

    sys.setprofile(profile)
    try:
        main(argv)
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
    assert state["done"], "the run never reached its first training step"
    return entries


def test_the_settings_enter_each_module_at_most_twice(tmp_path):
    path = settings_path(["train", "--backend", "none", "--nproc-per-node", "1",
                          "--max-iters", "1", "--epochs", "1", "--dataset", "synthetic",
                          "--dataset-size", "256", "--no-progress",
                          "--output-dir", str(tmp_path / "runs")])
    counts = collections.Counter(path)
    print(f"{len(path)} entries into {len(counts)} modules: {' > '.join(path)}")
    assert counts, "nothing traced: the test would pass on anything"
    assert "distkit.launch.checks" in counts and "distkit.train.training" in counts
    over = {m: n for m, n in counts.items() if n > 2}
    assert not over, (over, path)
