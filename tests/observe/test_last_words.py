"""Errors name the right rank (issue 31): when a rank of another node raises, node 0's
line names that rank and its last words (read from the traceback it wrote into the
shared run folder), not only the peer that saw its connection close."""
from __future__ import annotations

import pytest

from support import two_nodes


DIE = '''
import ignite.distributed as idist
from ignite.engine import Events
from distkit import Task
from distkit.tasks import BUILTIN_TASKS


def handlers(trainer, evaluator, config):
    @trainer.on(Events.ITERATION_COMPLETED(once=3))
    def boom(engine):
        if idist.get_rank() == 1:
            raise ValueError("rank one's last words")


base = BUILTIN_TASKS[("digits", "mlp")]
task = Task(datasets=base.datasets, model=base.model, name="die", score=base.score,
            handlers=handlers)
'''


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_node_0_names_the_rank_that_raised_on_node_1_and_its_last_words(tmp_path):
    (tmp_path / "die.py").write_text(DIE)
    nodes = two_nodes(tmp_path, ["--task", "die:task"], ["--task", "die:task"])
    lines = [[ln for ln in err.splitlines() if ln.startswith("distkit: error: ")]
             for _, _, err in nodes]
    assert all(code != 0 for code, _, _ in nodes)
    node0, node1 = lines[0][-1], lines[1][-1]
    assert node0.startswith("distkit: error: rank 1 (node 1 of 2) raised ValueError: rank one's "
                            "last words (its traceback: "), node0
    assert "tracebacks/rank1.txt); rank 0 (local rank 0, node 0 of 2) then lost it" in node0, node0
    assert node1.startswith("distkit: error: rank 1 (local rank 0, node 1 of 2) raised ValueError: "
                            "rank one's last words (at die.py:"), node1
