"""Whether a notebook kernel has initialised CUDA's driver decides whether its nccl ranks
can be forked. The question is asked of the driver library the process already holds, in
the driver's own terms: before ``cuInit`` every call answers CUDA_ERROR_NOT_INITIALIZED (3).
A library of the driver's name that answers as the driver does stands in for it here (this
machine has no GPU); on a GPU machine the real one answers (scripts/gpu_check.sh)."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

ASK = """
import ctypes, sys
if len(sys.argv) > 1:
    ctypes.CDLL(sys.argv[1])  # as torch's first CUDA call leaves it: the driver mapped
from distkit.host.facts import cuda_driver_initialised
print(cuda_driver_initialised())
"""


def _driver(tmp_path, answer: int) -> str:
    folder = tmp_path / str(answer)
    folder.mkdir()
    (folder / "driver.c").write_text(
        f"int cuDeviceGetCount(int *count) {{ *count = {int(answer == 0)}; return {answer}; }}\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", folder / "libcuda.so.1", folder / "driver.c"],
                   check=True, capture_output=True)
    return str(folder / "libcuda.so.1")


def _asked(*argv) -> str:
    done = subprocess.run([sys.executable, "-c", ASK, *argv], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here to build the stand-in driver")
def test_a_driver_is_initialised_only_when_it_answers_a_call_other_than_cuinit(tmp_path):
    assert _asked() == "False"                            # no driver in the process
    assert _asked(_driver(tmp_path, 3)) == "False"        # loaded, cuInit never called
    assert _asked(_driver(tmp_path, 0)) == "True"         # cuInit called: it answers
    assert _asked(_driver(tmp_path, 999)) == "True"       # answers otherwise: taken as used
