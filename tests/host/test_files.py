"""Files written whole (``distkit.host.files``): a reader sees the old file or the whole
new one, never half, and a write stopped anywhere (an error part-way, a signal, a full
disk) leaves no partial file behind. The one place the kit renames a file into place."""
from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from distkit.host.files import partial_path, whole, write_json, write_json_quietly, write_text, write_whole
from support import REPO_ROOT, subprocess_env


class Stop(Exception):
    pass


@settings(max_examples=60, deadline=None, print_blob=True)
@given(old=st.none() | st.text(max_size=50), chunks=st.lists(st.text(min_size=1, max_size=20), max_size=8),
       stop_after=st.none() | st.integers(min_value=0, max_value=8))
def test_a_write_stopped_after_any_chunk_leaves_the_old_file_and_no_partial(tmp_path_factory, old, chunks,
                                                                            stop_after):
    folder = tmp_path_factory.mktemp("w")
    path = str(folder / "record.json")
    if old is not None:
        write_text(path, old)

    def write(f):
        for i, chunk in enumerate(chunks):
            if i == stop_after:
                raise Stop
            f.write(chunk)
            f.flush()

    stopped = stop_after is not None and stop_after < len(chunks)
    try:
        write_whole(path, write)
    except Stop:
        assert stopped
    assert os.listdir(folder) == ([] if old is None and stopped else ["record.json"])
    if os.path.exists(path):
        with open(path, newline="") as f:
            assert f.read() == (old if stopped else "".join(chunks))


def test_a_writer_that_takes_a_name_gets_the_partial_one_and_the_rename(tmp_path):
    path = str(tmp_path / "plot.png")
    with whole(path) as partial:
        assert partial == partial_path(path) and partial != path
        with open(partial, "wb") as f:
            f.write(b"png")
    assert os.listdir(tmp_path) == ["plot.png"]
    with pytest.raises(ZeroDivisionError), whole(path) as partial:
        open(partial, "wb").close()
        1 / 0
    assert os.listdir(tmp_path) == ["plot.png"]


def test_json_keywords_and_a_refused_folder(tmp_path):
    path = str(tmp_path / "r.json")
    write_json(path, {"a": 1}, durable=True, dump={"indent": 2})
    assert json.loads(open(path).read()) == {"a": 1} and "\n" in open(path).read()
    with pytest.raises(ValueError):
        write_json(path, {"a": float("nan")}, dump={"allow_nan": False})
    assert os.listdir(tmp_path) == ["r.json"]
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert write_json_quietly(str(blocked / "sub" / "r.json"), {}) is None


WRITER = """
import os, sys, time
from distkit.host.files import write_whole
def write(f):
    f.write("x" * 100); f.flush()
    print("writing", flush=True)
    time.sleep(60)
write_whole(sys.argv[1], write)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_mid_write_leaves_no_partial_file(tmp_path, sig):
    """A rank stopped by its launcher while it writes its record: the kit's handlers turn
    these signals into exceptions (here Python's own for SIGINT; SIGTERM and SIGHUP as the
    kit's training does), so the partial file is removed on the way out."""
    code = ("import signal, sys\n"
            "def stop(signum, frame): raise SystemExit(128 + signum)\n"
            "signal.signal(signal.SIGTERM, stop); signal.signal(signal.SIGHUP, stop)\n" + WRITER)
    path = tmp_path / "rank1.json"
    p = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True,
                         env=subprocess_env())
    assert p.stdout.readline().strip() == "writing"
    assert [n for n in os.listdir(tmp_path) if n.endswith(".partial")]
    p.send_signal(sig)
    p.wait(timeout=30)
    assert os.listdir(tmp_path) == []


def _renames(path):
    """Lines of ``path`` that rename a file into place (``os.replace``/``os.rename``)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("replace", "rename") \
                and isinstance(node.value, ast.Name) and node.value.id == "os":
            yield node.lineno


def test_only_the_files_module_renames_files_into_place():
    """The bench's contender scripts are left out on purpose: they import only torch, their
    framework and the kit's models, so the comparison runs no kit code."""
    src = REPO_ROOT / "src" / "distkit"
    found = [f"{p.relative_to(src)}:{line}" for p in sorted(src.rglob("*.py"))
             if p.name != "files.py" and "contenders" not in p.parts for line in _renames(p)]
    assert found == [], f"write these through distkit.host.files: {found}"


def test_the_scan_sees_a_rename(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("import os\ndef f():\n    os.replace('a', 'b')\n")
    assert list(_renames(p)) == [3]
