"""The hang doctor (distkit.observe.hangs): its verdicts on drawn runs of every family
(pure functions over records), and on real gloo ranks under distkit launch."""
from __future__ import annotations

from hypothesis import given, settings

from distkit.observe import hangs
from hang_families import FAMILIES, cases


def _where(records, rank):
    return next(r for r in records if r["rank"] == rank).get("where")


@settings(max_examples=300, deadline=None)
@given(cases())
def test_the_verdict_names_the_odd_rank_what_and_where(case):
    lines = hangs.diagnose(case.records)
    verdict = lines[-1]
    assert len(lines) == case.world + 1, lines
    for rank, line in enumerate(lines[:-1]):
        assert line.startswith(f"rank {rank}: "), lines
    assert f"rank {case.rank}" in verdict, (case.family, lines)
    expected = {"op": "called different collectives", "shape": "different s",
                "dtype": "different dtypes", "missing": "never reached"}[case.kind]
    if case.family == "dies":
        expected = "died"
    assert expected in verdict, (case.family, lines)
    assert case.line in verdict or case.line in "\n".join(lines), (case.family, lines)


@settings(max_examples=100, deadline=None)
@given(cases(families=("wrong_op", "order", "shape", "dtype")))
def test_a_disagreement_names_both_ranks_collectives_at_their_lines(case):
    verdict = hangs.verdict(case.records)
    others = [r["rank"] for r in case.records if r["rank"] != case.rank]
    assert f"rank {case.rank}" in verdict, verdict
    assert any(f"rank {o}" in verdict for o in others), verdict
    assert _where(case.records, case.rank) in verdict, verdict
    mine = hangs.current(next(r for r in case.records if r["rank"] == case.rank))
    assert f"#{mine['seq']}" in verdict, verdict


@settings(max_examples=50, deadline=None)
@given(cases())
def test_the_ranks_that_agree_get_no_verdict(case):
    # every rank as the ones that did not go their own way: nothing to blame
    same = [r for r in case.records if r["rank"] != case.rank and r.get("state") != "ended"]
    if len(same) >= 2 and case.family not in ("skip",):
        assert "agree" in hangs.verdict(same), hangs.verdict(same)


def test_the_lines_of_the_issue():
    records = [
        {"rank": 0, "state": "in collective", "where": "train.py:15", "call": "all_reduce",
         "current": 4, "collectives": [
             {"group": "0", "seq": 4, "op": "all_reduce", "shapes": [[1000]],
              "dtypes": ["float32"], "done": False}]},
        {"rank": 1, "state": "in collective", "where": "train.py:17", "call": "broadcast",
         "current": 4, "collectives": [
             {"group": "0", "seq": 4, "op": "broadcast", "shapes": [[1000]],
              "dtypes": ["float32"], "done": False}]},
        {"rank": 2, "state": "computing", "where": "train.py:40", "collectives": []},
        {"rank": 3, "state": "died", "signal": "SIGKILL", "collectives": []}]
    assert hangs.diagnose(records) == [
        "rank 0: in all_reduce #4 (float32[1000]) at train.py:15",
        "rank 1: in broadcast #4 (float32[1000]) at train.py:17",
        "rank 2: not in a collective: at train.py:40",
        "rank 3: died (SIGKILL)",
        "verdict: rank 0 and rank 1 called different collectives (#4: all_reduce at "
        "train.py:15 vs broadcast at train.py:17)"]


def test_torchs_dump_is_read_as_collectives():
    fr = {"entries": [{"pg_id": 0, "collective_seq_id": 2, "profiling_name": "gloo:all_gather",
                       "input_sizes": [[64]], "input_dtypes": ["Float"], "retired": False,
                       "is_p2p": False},
                      {"pg_id": 0, "collective_seq_id": 0, "profiling_name": "gloo:send",
                       "input_sizes": [[1]], "input_dtypes": ["Long"], "is_p2p": True}]}
    assert hangs.collectives_from_fr(fr) == [{"group": "0", "seq": 2, "op": "all_gather",
                                              "shapes": [[64]], "dtypes": ["float32"],
                                              "done": False}]
