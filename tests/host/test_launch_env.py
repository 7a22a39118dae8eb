"""The torchrun / SLURM environment: read by one module (distkit.host.layout), and a value
no launcher would set refused there in one line naming the variable and the fix.

The values are drawn by Hypothesis (the variable, and garbage for it: text, negatives,
out of range, missing); the reader runs in-process for many cases and the real
``distkit train`` / ``distkit launch`` in a subprocess for a few. Each drawn case prints
its seed line (``DISTKIT_ENV_SEED=<n>`` replays the whole draw)."""
from __future__ import annotations

import ast
import os
import random
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, note, seed, settings
from hypothesis import strategies as st

from support import REPO_ROOT, subprocess_env, within_seconds
from distkit.host.layout import PER_RANK, LayoutError, tasks_on_node, world_layout
from distkit.train.signals import FAILED_IN_SLURM_STEP

SRC = REPO_ROOT / "src" / "distkit"
READER = SRC / "host" / "layout.py"
# Stand-ins for a user's own plain-torch script in the benchmarks: they read torchrun's
# variables as such a script does, without the kit, on purpose.
NOT_THE_KIT = (SRC / "bench" / "contenders",)
SEED = int(os.environ.get("DISTKIT_ENV_SEED", random.randrange(2**32)))
print(f"test_launch_env: DISTKIT_ENV_SEED={SEED}")


def launcher_variable(name) -> bool:
    return isinstance(name, str) and (
        name in {"WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
        or name.startswith(("SLURM_", "TORCHELASTIC_")))


def _environ(node) -> bool:
    """``os.environ``, ``environ``, ``self.environ`` ... (not a child's ``env`` dict)."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or \
        (isinstance(node, ast.Name) and node.id == "environ")


def reads_of_launcher_variables(source: str) -> list[tuple[int, str]]:
    """``(line, name)`` of every read of a launcher variable from the environment:
    ``environ[...]``, ``environ.get(...)``, ``... in environ``, ``os.getenv(...)``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        key = None
        if isinstance(node, ast.Subscript) and _environ(node.value) and isinstance(node.ctx, ast.Load):
            key = node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args and (
                (node.func.attr in ("get", "pop", "setdefault") and _environ(node.func.value))
                or node.func.attr == "getenv"):
            key = node.args[0]
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) \
                and any(_environ(c) for c in node.comparators):
            key = node.left
        if isinstance(key, ast.Constant) and launcher_variable(key.value):
            found.append((node.lineno, key.value))
    return found


def test_only_the_layout_module_reads_the_launcher_variables():
    readers = {}
    for path in sorted(SRC.rglob("*.py")):
        if path == READER or any(part in path.parents for part in NOT_THE_KIT):
            continue
        found = reads_of_launcher_variables(path.read_text())
        if found:
            readers[str(path.relative_to(SRC))] = found
    assert not readers, f"read outside distkit/host/layout.py: {readers}"
    assert reads_of_launcher_variables(READER.read_text())  # the reader itself is seen


@pytest.mark.parametrize("line", ['int(os.environ["RANK"])', 'os.environ.get("SLURM_PROCID", "0")',
                                  '"WORLD_SIZE" in os.environ', 'os.getenv("MASTER_PORT")',
                                  'environ.get("TORCHELASTIC_RUN_ID")'])
def test_the_scan_sees_each_way_of_reading(line):
    assert reads_of_launcher_variables(f"import os\nx = {line}\n")


def test_the_scan_ignores_a_childs_environment_and_writes():
    assert not reads_of_launcher_variables('env = {}\nenv["RANK"] = "1"\nx = env["RANK"]\n'
                                           'import os\nos.environ["RANK"] = "0"\n')


# --------------------------------------------------------------------------------------
# Valid launches, drawn, are read back as set
# --------------------------------------------------------------------------------------

@st.composite
def torchrun_env(draw):
    nnodes = draw(st.integers(1, 4))
    local_world = draw(st.integers(1, 8))
    world = nnodes * local_world
    node = draw(st.integers(0, nnodes - 1))
    local = draw(st.integers(0, local_world - 1))
    env = {"WORLD_SIZE": world, "RANK": node * local_world + local, "LOCAL_RANK": local,
           "LOCAL_WORLD_SIZE": local_world, "GROUP_RANK": node, "GROUP_WORLD_SIZE": nnodes,
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": draw(st.integers(1, 65535))}
    return {k: str(v) for k, v in env.items()}


@st.composite
def slurm_env(draw):
    nnodes = draw(st.integers(1, 4))
    per_node = draw(st.integers(1, 8))
    node = draw(st.integers(0, nnodes - 1))
    local = draw(st.integers(0, per_node - 1))
    job = draw(st.integers(1, 10**7))
    env = {"SLURM_JOB_ID": job, "SLURM_STEP_ID": 0, "SLURM_PROCID": node * per_node + local,
           "SLURM_LOCALID": local, "SLURM_NODEID": node, "SLURM_NTASKS": nnodes * per_node,
           "SLURM_NNODES": nnodes, "SLURM_TASKS_PER_NODE": f"{per_node}(x{nnodes})",
           "SLURM_JOB_NODELIST": f"node[{1:02d}-{nnodes:02d}]"}
    return {k: str(v) for k, v in env.items()}


@seed(SEED)
@settings(max_examples=200, deadline=None, print_blob=True)
@given(torchrun_env())
def test_a_torchrun_launch_is_read_as_set(env):
    note(f"replay: DISTKIT_ENV_SEED={SEED} pytest tests/host/test_launch_env.py")
    layout = world_layout(env)
    assert (layout.rank, layout.local_rank, layout.world_size, layout.local_world_size,
            layout.node_rank, layout.nnodes, layout.master_port) == tuple(int(env[k]) for k in (
                "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "GROUP_WORLD_SIZE", "MASTER_PORT"))
    assert layout.launcher == "torchrun"


@seed(SEED)
@settings(max_examples=100, deadline=None, print_blob=True)
@given(slurm_env())
def test_a_slurm_step_is_read_as_set(env):
    note(f"replay: DISTKIT_ENV_SEED={SEED} pytest tests/host/test_launch_env.py")
    layout = world_layout(env)
    assert (layout.rank, layout.local_rank, layout.world_size, layout.nnodes, layout.node_rank) == \
        tuple(int(env[k]) for k in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NNODES",
                                    "SLURM_NODEID"))
    assert layout.local_world_size == int(env["SLURM_NTASKS"]) // int(env["SLURM_NNODES"])
    assert layout.master_addr == "node01"
    assert layout.master_port == 15000 + int(env["SLURM_JOB_ID"][-4:])
    assert layout.launcher == "slurm"


def test_the_steps_own_tasks_per_node_come_first():
    env = {"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "4", "SLURM_NNODES": "2",
           "SLURM_NODEID": "1", "SLURM_NTASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "2(x2)"}
    assert tasks_on_node(env) == 2
    assert tasks_on_node({**env, "SLURM_STEP_TASKS_PER_NODE": "3,1"}) == 1


# --------------------------------------------------------------------------------------
# Garbage, drawn: one line naming the variable
# --------------------------------------------------------------------------------------

# what an environment can hold: any text but NUL (the C strings of execve end at it)
TEXT = st.text(st.characters(exclude_characters="\x00"), min_size=1, max_size=12).filter(
    lambda s: not (s.strip().removeprefix("-").isascii() and s.strip().removeprefix("-").isdigit()))


def garbage_for(name: str, env: dict):
    """Values that no launcher would give ``name`` in ``env``: text, negatives, values out
    of range, or nothing at all (None: the variable is removed)."""
    if name in ("MASTER_PORT",):
        out_of_range = st.sampled_from([0, 65536, 70000, 10**6])
    elif name in ("WORLD_SIZE", "SLURM_NTASKS"):
        out_of_range = st.sampled_from([0])
    else:
        bound = {"RANK": "WORLD_SIZE", "LOCAL_RANK": "LOCAL_WORLD_SIZE", "GROUP_RANK": "GROUP_WORLD_SIZE",
                 "SLURM_PROCID": "SLURM_NTASKS", "SLURM_NODEID": "SLURM_NNODES",
                 "SLURM_LOCALID": None}.get(name)
        top = int(env[bound]) if bound else int(env["SLURM_NTASKS"]) // int(env["SLURM_NNODES"])
        out_of_range = st.integers(top, top + 10**6)
    choices = [TEXT, st.integers(-10**6, -1), out_of_range]
    if name in ("RANK", "LOCAL_RANK"):  # without SLURM_PROCID it is no job step at all
        choices.append(st.none())
    return st.one_of(*choices)


TORCHRUN_CHECKED = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT", "GROUP_RANK")
SLURM_CHECKED = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "MASTER_PORT")


@st.composite
def garbage_env(draw, launch=None):
    kind = launch or draw(st.sampled_from(["torchrun", "slurm"]))
    env = draw(torchrun_env() if kind == "torchrun" else slurm_env())
    name = draw(st.sampled_from(TORCHRUN_CHECKED if kind == "torchrun" else SLURM_CHECKED))
    value = draw(garbage_for(name, env))
    if value is None:
        env.pop(name)
    else:
        env[name] = str(value)
    return name, env


def assert_one_line_naming(message: str, name: str) -> None:
    assert "\n" not in message, message
    assert name in message, message
    assert any(fix in message for fix in ("torchrun", "srun")), message


@seed(SEED)
@settings(max_examples=300, deadline=None, print_blob=True)
@given(garbage_env())
def test_garbage_is_refused_in_one_line_naming_the_variable(case):
    note(f"replay: DISTKIT_ENV_SEED={SEED} pytest tests/host/test_launch_env.py")
    name, env = case
    with pytest.raises(LayoutError) as e:
        world_layout(env)
    assert_one_line_naming(str(e.value), name)


# --------------------------------------------------------------------------------------
# The real commands, a few drawn cases each
# --------------------------------------------------------------------------------------

SCRIPT = "import torch.distributed as dist\nprint('the script ran')\n"


def clean_env(extra: dict) -> dict:
    env = {k: v for k, v in subprocess_env().items()
           if not launcher_variable(k) and k not in ("RANK", "WORLD_SIZE")}
    return {**env, **extra}


def run_command(args, env, cwd) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "distkit", *args], cwd=cwd, env=clean_env(env),
                         capture_output=True, text=True, timeout=within_seconds(60) + 60)
    return out, time.monotonic() - start


@pytest.mark.parametrize("command", ["train", "launch"])
@seed(SEED)
@settings(max_examples=3, deadline=None, print_blob=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=garbage_env())
def test_the_commands_refuse_garbage_in_one_line(command, case, tmp_path):
    note(f"replay: DISTKIT_ENV_SEED={SEED} pytest tests/host/test_launch_env.py")
    name, env = case
    # rank 0 of the launch, where the drawn variable is not this rank's own: rank 0 is
    # the one that says what every rank refused
    env.update({k: "0" for k in PER_RANK if k in env and k != name})
    (tmp_path / "script.py").write_text(SCRIPT)
    args = ["train", "--output-dir", str(tmp_path / "runs")] if command == "train" else ["launch", "script.py"]
    out, seconds = run_command(args, env, tmp_path)
    print(f"{command} with {name}={env.get(name)!r}: exit {out.returncode} in {seconds:.1f} s")
    # a failure in a task of an srun step outranks every stop code (docs/failures.md)
    assert out.returncode == (FAILED_IN_SLURM_STEP if "SLURM_PROCID" in env else 1), out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("distkit: error: "), out.stderr
    assert_one_line_naming(lines[0], name)
    assert "the script ran" not in out.stdout
    assert seconds < within_seconds(30)
