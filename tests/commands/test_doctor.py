"""``distkit doctor`` in plain words: a CUDA build of torch on a machine without a GPU and
a loaded machine are named, each with what to do; the report a person reads carries no
key names or Python values (``compat_applied``, ``fork_safe_cuda_check``, ``launched_by
None``). The report's facts themselves: tests/commands/test_cli.py and tests/launch/test_units.py."""
from __future__ import annotations

import json
import re
import subprocess
import sys

from hypothesis import given, note, settings
from hypothesis import strategies as st

from support import subprocess_env, within_seconds
from distkit.commands import doctor

# What only the code knows: the JSON's keys, shim names, Python's None / True / False.
INTERNAL = re.compile(r"compat_applied|launched_by|fork_safe_cuda_check|xla_\w+|cuda_available|"
                      r"backends_built|torch_build|ram_gib|\bNone\b|\bTrue\b|\bFalse\b")


def info_of(cuda: str | None, gpus: int, load: float, cores: int, colab: bool = False,
            launched_by: str | None = None, shims=("fork_safe_cuda_check",)) -> dict:
    """A report as ``doctor.report()`` makes it, for a machine drawn by the test."""
    return {
        "distkit": "0.1.0", "python": "3.11.7", "os": "Linux", "ram_gib": {"total": 24.0, "available": 12.0},
        "torch": "2.15.0" + ("+cu132" if cuda else "+cpu"),
        "torch_build": {"cuda": cuda, "cudnn": "9.26.0" if cuda else None, "nccl": "2.30.7" if cuda else None},
        "ignite": "0.5.5", "cores": cores, "cuda_available": gpus > 0,
        "gpus": [{"name": "NVIDIA H100", "memory_gib": 79.2}] * gpus, "tpu": False,
        "backends": ["nccl", "gloo"] if gpus else ["gloo"], "backends_built": ["nccl", "gloo"] if cuda else ["gloo"],
        "load_average": load, "colab": colab, "launched_by": launched_by, "environment": {},
        "compat_applied": list(shims), "torchvision": "0.29.2", "torch_xla": None,
        "network": "GLOO_SOCKET_IFNAME=eth0", "recommended": {},
    }


@settings(max_examples=60, deadline=None)
@given(cuda=st.sampled_from([None, "12.6", "13.2"]), gpus=st.integers(0, 2),
       load=st.floats(0, 64, allow_nan=False).map(lambda x: round(x, 1)), cores=st.integers(1, 64),
       launched_by=st.sampled_from([None, "torchrun", "slurm"]),
       shims=st.lists(st.sampled_from(sorted(doctor.SHIM_WORDS)), unique=True, max_size=3))
def test_advice_names_a_cuda_build_without_gpu_and_a_loaded_machine(cuda, gpus, load, cores, launched_by, shims):
    if not cuda:
        gpus = 0  # a CPU-only torch sees no GPU
    note(f"cuda={cuda!r} gpus={gpus} load={load} cores={cores} launched_by={launched_by!r} shims={shims}")
    info = info_of(cuda, gpus, load, cores, launched_by=launched_by, shims=shims)
    tips = doctor.advice(info)
    cpu_build = [t for t in tips if doctor.CPU_TORCH in t]
    assert len(cpu_build) == (1 if cuda and not gpus else 0), tips
    if cpu_build:
        assert f"CUDA {cuda} build" in cpu_build[0] and "no GPU" in cpu_build[0]
    busy = [t for t in tips if t.startswith("this machine is loaded")]
    assert len(busy) == (1 if load > cores else 0), tips
    if busy:
        assert f"{load} processes want its {cores} core(s)" in busy[0] and "slower" in busy[0]
    shown = "\n".join(f"{label}  {text}" for label, text in doctor.described(info))
    assert not INTERNAL.search(shown), INTERNAL.search(shown)
    assert ("loaded, timings will be slow" in shown) == (load > cores)


def test_the_report_a_person_reads_is_in_plain_words():
    out = subprocess.run([sys.executable, "-m", "distkit", "doctor"], capture_output=True, text=True,
                         timeout=within_seconds(90), env=subprocess_env())
    assert out.returncode == 0, out.stderr[-2000:]
    assert not INTERNAL.search(out.stdout), INTERNAL.search(out.stdout)
    report = dict(re.split(r"\s{2,}", ln, maxsplit=1) for ln in out.stdout.split("\n\n")[0].splitlines())
    assert report["launched by"].startswith(("this command", "torchrun", "slurm")), report
    assert re.match(r"[\d.]+ on \d+ core\(s\), last minute: ", report["load"]), report
    # --json keeps the keys, and has the load it judged by
    info = json.loads(subprocess.run([sys.executable, "-m", "distkit", "doctor", "--json"], capture_output=True,
                                     text=True, timeout=within_seconds(90), env=subprocess_env()).stdout)
    assert info["load_average"] >= 0 and "compat_applied" in info
    import torch

    if torch.version.cuda and not torch.cuda.is_available():  # this machine: a CUDA build, no GPU
        assert doctor.CPU_TORCH in out.stdout
