"""Output folders named in any script: unicode of several scripts, spaces, quotes, names
as long as the file system allows. Drawn by Hypothesis (seed printed): in one process
for the naming (the run folder, the "resume with:" command, the stop line read back),
across 2 gloo ranks for the broadcast that tells every rank the run folder, and in real
``distkit train`` runs for a few drawn names; a resume that asks for no more iterations
than its checkpoint holds is refused in one line."""
from __future__ import annotations

import os
import pickle
import random
import shlex
import signal
import sys

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from distkit.checkpoint.saver import make_run_dir
from distkit.train.signals import Preempted, resume_command, stopped_line

SEED = int(os.environ.get("DISTKIT_TEST_SEED") or random.randrange(2**32))
print(f"tests/config/test_output_dir_names.py: Hypothesis seed {SEED} (reproduce: "
      f"DISTKIT_TEST_SEED={SEED} python -m pytest tests/config/test_output_dir_names.py)", file=sys.stderr)
NAME_MAX = os.pathconf("/tmp", "PC_NAME_MAX")  # bytes in one path component (255 on ext4/tmpfs)

# Letters of several scripts, and the characters shells and parsers trip on.
SCRIPTS = st.sampled_from([
    st.characters(min_codepoint=0xC0, max_codepoint=0x17F),    # Latin accents: données
    st.characters(min_codepoint=0x391, max_codepoint=0x3C9),   # Greek
    st.characters(min_codepoint=0x410, max_codepoint=0x44F),   # Cyrillic
    st.characters(min_codepoint=0x4E00, max_codepoint=0x4FFF),  # CJK
    st.characters(min_codepoint=0x627, max_codepoint=0x64A),   # Arabic
    st.characters(min_codepoint=0x1F600, max_codepoint=0x1F64F),  # emoji (4 bytes each)
    st.sampled_from(list(" '\"`$;&|\\*?!#()[]{}<>~-=,.")),
    st.characters(min_codepoint=ord("a"), max_codepoint=ord("z")),
])


@st.composite
def folder_names(draw, max_bytes=NAME_MAX):
    """One path component: a mix of scripts, spaces and quotes, up to ``max_bytes`` bytes
    in UTF-8 (long ones drawn often: the limit is where encodings bite)."""
    parts = draw(st.lists(SCRIPTS, min_size=1, max_size=4))
    text = "".join(draw(st.text(alphabet=p, min_size=1, max_size=80)) for p in parts)
    if draw(st.booleans()):  # as long as the file system allows
        while len((text + text).encode()) <= max_bytes:
            text += text
    while len(text.encode()) > max_bytes:
        text = text[:-1]
    text = text.replace("/", "_").replace("\0", "_")
    if text.strip(".") == "" or text.startswith("-"):
        text = "r" + text[:-1] if len(text.encode()) >= max_bytes else "r" + text
    return text


DRAWN = settings(max_examples=80, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow])


@seed(SEED)
@DRAWN
@given(name=folder_names())
def test_run_folder_and_resume_command_keep_the_name(tmp_path_factory, name):
    parent = tmp_path_factory.mktemp("out")
    run_dir = make_run_dir(str(parent / name), "gloo", 2)
    assert os.listdir(parent) == [name]  # the folder has exactly the name asked for
    checkpoint = os.path.join(run_dir, "checkpoints", "training_checkpoint_7.pt")
    argv = ["distkit", "train", "--output-dir", str(parent / name), "--max-iters", "7"]
    # the stop crosses from the ranks to the launcher whole (pickled, or as a failure
    # record's fields), never as text parsed back: the path survives
    stopped = pickle.loads(pickle.dumps(Preempted(stopped_line(signal.SIGTERM, 7, 1, checkpoint),
                                                  signal.SIGTERM, checkpoint)))
    assert stopped.checkpoint == checkpoint
    command = resume_command(stopped.checkpoint, argv)
    assert shlex.split(command) == [*argv, "--resume-from", checkpoint], command


def _broadcast_every_name(local_rank, names):
    import ignite.distributed as idist

    from distkit.compat.shims import broadcast_text

    rank = idist.get_rank()
    return [broadcast_text(name if rank == 0 else "", src=0) for name in names]


@pytest.mark.slow
def test_every_rank_learns_the_run_folder_in_any_script():
    """The run folder's name goes from rank 0 to the others (node 1 of a multi-node run
    learns it so): 2 gloo ranks, one process group, 60 drawn names."""
    from distkit.launch.entry import launch_function

    names = []

    @seed(SEED)
    @settings(max_examples=60, deadline=None, database=None)
    @given(name=folder_names(max_bytes=4096))
    def draw(name):
        names.append(name)

    draw()
    per_rank = launch_function(_broadcast_every_name, names, backend="gloo", nproc_per_node=2,
                               all_ranks=True)
    assert per_rank[0] == names
    assert per_rank[1] == names


@pytest.mark.slow
def test_train_writes_to_the_drawn_folder_and_refuses_a_resume_with_nothing_left(run_cli, tmp_path):
    """Real runs of 2 gloo processes, each under a drawn name; then a resume whose
    --max-iters is not beyond the checkpoint's iteration is refused in one line."""
    rng = random.Random(SEED)
    names = []

    @seed(rng.randrange(2**32))
    @settings(max_examples=2, deadline=None, database=None)
    @given(name=folder_names(max_bytes=NAME_MAX - 8))
    def draw(name):
        names.append(name)

    draw()
    tiny = ["--dataset", "synthetic", "--dataset-size", "256", "--epochs", "1", "--no-progress",
            "--nproc-per-node", "2", "--backend", "gloo"]
    for i, name in enumerate(names[:2]):
        out = tmp_path / f"o{i}" / name
        done = run_cli("train", *tiny, "--max-iters", "2", "--output-dir", out, timeout=600)
        assert done.returncode == 0, (name, done.stderr[-2000:])
        (run,) = out.iterdir()
        assert (run / "results.json").is_file(), (name, sorted(p.name for p in run.iterdir()))
        again = run_cli("train", *tiny, "--max-iters", "2", "--output-dir", out,
                        "--resume-from", "latest", timeout=600)
        assert again.returncode != 0
        line = again.stderr.strip().splitlines()[-1]
        assert line.startswith("distkit: error: --max-iters 2 is not beyond the 2 iterations"), \
            (name, again.stderr[-2000:])
        assert len(list(out.iterdir())) == 1  # refused before a run folder was made
