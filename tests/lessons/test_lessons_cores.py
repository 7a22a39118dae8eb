"""distkit.lessons.cores: the notebook sentences that depend on the core count are
computed from the machine, and say the right thing on other machines too (notebooks 04
and 08 print them)."""
from __future__ import annotations

import os

import pytest

from distkit.lessons import cores


@pytest.mark.parametrize("machine, expected", [
    (2, "this machine has 2 cores: N=4 processes share them, 2 per core"),
    (3, "this machine has 3 cores: N=4 processes share them, 1.33 per core"),
    (4, "this machine has 4 cores: N=4 processes get one core each"),
    (8, "this machine has 8 cores: N=4 processes, one torch thread each, run on 4 of them"),
])
def test_sharing_sentence_follows_the_machine(monkeypatch, capsys, machine, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(machine)), raising=False)
    print(cores.sharing_sentence(4))  # what notebook 08 prints, on a machine of `machine` cores
    assert capsys.readouterr().out.strip() == expected
    assert "per core" not in expected or machine < 4


@pytest.mark.parametrize("machine, threads, expected", [
    (2, 1, "each of the 2 spawned processes had 1 CPU thread (2 cores // 2 processes); the single "
           "process gets 1 too, so the comparison asks what a second process, on a second core, buys"),
    (8, 4, "each of the 2 spawned processes had 4 CPU threads (8 cores // 2 processes); the single "
           "process gets 4 too, so the comparison asks what a second process, on 4 more cores, buys"),
])
def test_threads_sentence_follows_the_machine(monkeypatch, capsys, machine, threads, expected):
    from distkit.host.facts import threads_per_process

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(machine)), raising=False)
    assert threads_per_process(2) == threads  # what notebook 04 passes in
    print(cores.threads_sentence(2, threads_per_process(2)))
    assert capsys.readouterr().out.strip() == expected
