"""Checks for exercise 15: reading a merged trace. First a trace built by hand, whose
answer is known exactly; then the trace of a real run of 3 gloo processes in which the
check made rank 2 slow on purpose."""
import itertools
import math
import numbers
import random
import sys
import tempfile

import pytest

import harness

pytestmark = pytest.mark.ex15

# --- a trace whose numbers are known ------------------------------------------------------
# 3 ranks, 2 recorded steps of 100 ms each, a 20 ms gap between them (the trace is 220 ms
# long, its steps 200 ms). In each step every rank runs two all-reduces at once (two
# gloo threads, overlapping ranges), which end together when the last rank joins; rank 2
# is the slow one: it joins last. Per step, the time each rank had a collective running:
# rank 0: 20-95 ms = 75 ms, rank 1: 40-95 = 55 ms, rank 2: 80-95 = 15 ms.
STEP_US, GAP_US = 100_000, 20_000
STARTS_MS = {0: (20, 25), 1: (40, 45), 2: (80, 85)}  # each rank's two all-reduces start
ENDS_MS = (90, 95)
TRUE_COVERED_US = {0: 2 * 75_000, 1: 2 * 55_000, 2: 2 * 15_000}
TRUE_SLOW = 2
TRUE_FRACTION = ((150_000 - 30_000) / 200_000 + (110_000 - 30_000) / 200_000) / 2  # 0.5


def known_trace():
    events = []
    for rank in range(3):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": 7,
                       "args": {"name": "gloo worker"}})
        for step in range(2):
            t0 = step * (STEP_US + GAP_US)
            events.append({"ph": "X", "name": f"ProfilerStep#{step + 3}", "pid": rank, "tid": 1,
                           "ts": t0, "dur": STEP_US})
            events.append({"ph": "X", "name": "forward", "pid": rank, "tid": 1, "ts": t0 + 1000,
                           "dur": 15_000})
            for k, (start, end) in enumerate(zip(STARTS_MS[rank], ENDS_MS)):
                # the main thread's call: it only hands the work to gloo (a few us)
                events.append({"ph": "X", "name": "c10d::allreduce_", "pid": rank, "tid": 1,
                               "ts": t0 + start * 1000 - 10, "dur": 8})
                events.append({"ph": "X", "name": "gloo:all_reduce", "pid": rank, "tid": 7 + k,
                               "ts": t0 + start * 1000, "dur": (end - start) * 1000})
            events.append({"ph": "s", "name": "fwdbwd", "pid": rank, "tid": 1, "ts": t0 + 2000,
                           "id": step})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _advice(error):
    return (" A merged trace also holds events with no duration (\"ph\": \"M\" names, flow arrows, no "
            "\"ts\" or \"dur\" on some): keep the complete events (\"ph\": \"X\") first")


def answers(ex, trace, ranks, on="") -> dict:
    """What ``ex``'s three functions give on ``trace`` (:func:`harness.outcome`'s data), in the
    order they are judged, up to the first that raised."""
    found = {"covered": []}
    for rank in ranks:
        found["covered"].append(harness.outcome(f"{on}time_in_collectives(trace, {rank})", ex.time_in_collectives,
                                                trace, rank, advice=_advice))
        if "returned" not in found["covered"][-1]:
            return found
    found["slow"] = harness.outcome(f"{on}slow_rank(trace)", ex.slow_rank, trace, advice=_advice)
    if "returned" in found["slow"]:
        found["fraction"] = harness.outcome(f"{on}waited_fraction(trace)", ex.waited_fraction, trace,
                                            advice=_advice)
    return found


def _at(got, key, index=None):
    """``got[key]`` (``[index]``) of an answer's data, or None where it is missing (judged a failure)."""
    value = got.get(key) if isinstance(got, dict) else None
    if index is None:
        return value
    return value[index] if isinstance(value, list) and index < len(value) else None


def _number(value, what):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise harness.ExerciseFailure(f"{what} returned {harness.describe(value)} ({type(value).__name__}); "
                                      "return a number")
    return float(value)


def explain_covered(got_all, trace, truth, on=""):
    for index, (rank, want) in enumerate(truth.items()):
        what = f"{on}time_in_collectives(trace, {rank})"
        got = _number(harness.returned(_at(got_all, "covered", index)), what)
        if math.isclose(got, want, rel_tol=1e-9):
            continue
        common = (f"{what} returned {got:g} us, but rank {rank} had "
                  f"a collective running for {want:g} us")
        mine = [e for e in trace["traceEvents"] if e.get("pid") == rank and e.get("ph") == "X"]
        summed = sum(e["dur"] for e in mine if e["name"].startswith(("gloo:", "nccl:")))
        if math.isclose(got, summed, rel_tol=1e-9):
            raise harness.ExerciseFailure(
                f"{common}: you added up the durations, but two collectives in flight at once "
                f"(two gloo threads) overlap; count the time they COVER: sort the ranges by "
                f"start and add only what each adds beyond the ones before it")
        for prefix in ("gloo:", "nccl:"):
            only = _covered([e for e in mine if e["name"].startswith(prefix)])
            if only != want and math.isclose(got, only, rel_tol=1e-9):
                raise harness.ExerciseFailure(
                    f"{common}: you kept only the names that start with {prefix!r}; a run on GPUs (nccl) "
                    f"names its collectives 'nccl:...', on CPUs (gloo) 'gloo:...': keep every name that "
                    f"starts with one of COLLECTIVE_PREFIXES")
        in_file_order = _covered([e for e in mine if e["name"].startswith(("gloo:", "nccl:"))], sort=False)
        if in_file_order != want and math.isclose(got, in_file_order, rel_tol=1e-9):
            raise harness.ExerciseFailure(
                f"{common}: the events of a trace are not in the order of their start times (this one's are "
                f"shuffled, as a merged trace's threads may be): sort the ranges by start (\"ts\") before "
                f"walking them")
        walked = _covered([e for e in mine if e["name"].startswith(("gloo:", "nccl:"))], inside=True)
        if walked != want and math.isclose(got, walked, rel_tol=1e-9):
            raise harness.ExerciseFailure(
                f"{common}: here a range lies inside an earlier one (it starts after it and ends before it): "
                f"it adds nothing, but your walk added its end minus the earlier end, a negative length. Add "
                f"only when a range reaches beyond the latest end seen so far, and keep that latest end")
        if got > want:
            raise harness.ExerciseFailure(
                f"{common}: did you count events that are not collectives (c10d::allreduce_ is "
                f"the main thread handing the work to gloo), or a range that lies inside an earlier one "
                f"(it adds nothing: keep the latest end seen so far, and add only what reaches beyond it)? "
                f"Keep the names that start with COLLECTIVE_PREFIXES")
        raise harness.ExerciseFailure(f"{common}: keep every complete event (\"ph\": \"X\") of "
                                      f"that rank (\"pid\") whose name starts with COLLECTIVE_PREFIXES, and "
                                      f"count the time their ranges cover")


def explain_slow(got_all, trace, truth_slow, covered, on=""):
    got = harness.returned(_at(got_all, "slow"))
    if isinstance(got, numbers.Integral) and not isinstance(got, bool) and got == truth_slow:
        return
    busiest = max(covered, key=covered.get)
    if isinstance(got, numbers.Integral) and not isinstance(got, bool) and got not in covered:
        hint = (f" there is no rank {got} in this trace (its ranks, the \"pid\"s of its complete events: "
                f"{sorted(covered)}): take the ranks from the trace, do not write them in")
    elif isinstance(got, (tuple, list)) and truth_slow in got:
        hint = f" return the rank alone, an int (you returned {harness.describe(got)}, the rank among other things)"
    elif isinstance(got, str) and str(truth_slow) in got:
        hint = " return the rank as an int (the \"pid\" of its events), not text"
    elif got == busiest:
        hint = (" that is the rank that spent the MOST time in collectives: it arrived first and "
                "waited longest; the slow rank arrives last and waits least")
    elif got == max(covered) and truth_slow != max(covered):
        hint = (f" that is the last rank of the trace: the slow rank can be any of them (here rank "
                f"{truth_slow}); return the one with the least time in collectives")
    else:
        hint = " return the rank with the least time in collectives"
    raise harness.ExerciseFailure(
        f"{on}slow_rank returned {got!r}, but the others waited for rank {truth_slow} (time in "
        f"collectives per rank, us: {covered}):{hint}")


def explain_fraction(got_all, trace, truth, slow, covered, steps_us, span_us, on=""):
    what = f"{on}waited_fraction(trace)"
    got = _number(harness.returned(_at(got_all, "fraction")), what)
    if math.isclose(got, truth, rel_tol=1e-6):
        return
    others = [r for r in covered if r != slow]
    raw = sum(covered[r] / steps_us[r] for r in others) / len(others)
    common = f"{what} returned {got:.4g}, but the other ranks waited {truth:.4g} of their steps"
    if math.isclose(got, 100 * truth, rel_tol=1e-6):
        raise harness.ExerciseFailure(f"{common}: that is a percentage; return the fraction")
    if math.isclose(got, raw, rel_tol=1e-6):
        raise harness.ExerciseFailure(
            f"{common}: you divided the whole time in collectives, but part of it is what the "
            f"collective costs anyway (the slow rank's own time in it, {covered[slow]:g} us); "
            f"subtract the slow rank's time first")
    with_slow = truth * len(others) / (len(others) + 1)
    if math.isclose(got, with_slow, rel_tol=1e-6):
        raise harness.ExerciseFailure(
            f"{common}: you took the mean over every rank, the slow one (which waited 0) too; "
            f"average over the OTHER ranks only")
    share = {r: (covered[r] - covered[slow]) / steps_us[r] for r in others}
    for left_out in itertools.chain.from_iterable(itertools.combinations(others, k) for k in range(1, len(others))):
        kept = [r for r in others if r not in left_out]
        if math.isclose(got, sum(share[r] for r in kept) / len(kept), rel_tol=1e-6):
            raise harness.ExerciseFailure(
                f"{common}: that is the mean over ranks {kept} only; this trace's other ranks are {others} "
                f"(rank(s) {list(left_out)} left out): take the ranks from the trace (the \"pid\"s of its "
                f"complete events), do not write them in")
    n_steps = {r: sum(1 for e in trace["traceEvents"] if e.get("pid") == r and e.get("ph") == "X"
                      and e["name"].startswith("ProfilerStep#")) for r in others}
    per_step = sum((covered[r] - covered[slow]) / (steps_us[r] / n_steps[r])
                   for r in others) / len(others)
    whole = sum((covered[r] - covered[slow]) / span_us[r] for r in others) / len(others)
    pooled = sum(covered[r] - covered[slow] for r in others) / sum(steps_us[r] for r in others)
    if math.isclose(got, per_step, rel_tol=1e-6):
        raise harness.ExerciseFailure(
            f"{common}: you divided by ONE step, but the waiting was added up over all the "
            f"recorded steps; divide by the time of all of the rank's ProfilerStep#N events")
    if math.isclose(got, whole, rel_tol=1e-6):
        raise harness.ExerciseFailure(
            f"{common}: you divided by the trace's whole length, gaps between steps included; "
            f"divide by the time of the rank's ProfilerStep#N events")
    if not math.isclose(pooled, truth, rel_tol=1e-6) and math.isclose(got, pooled, rel_tol=1e-6):
        raise harness.ExerciseFailure(
            f"{common}: you divided the other ranks' waiting, summed, by their steps' time, summed: a "
            f"ratio of sums, which equals the mean of each rank's share only when their steps last "
            f"equally long (here they do not: {[steps_us[r] for r in others]} us). Take each other "
            f"rank's share, then the mean")
    first = {r: next(e["dur"] for e in trace["traceEvents"] if e.get("pid") == r and e.get("ph") == "X"
                     and e["name"].startswith("ProfilerStep#")) for r in others}
    as_first = sum((covered[r] - covered[slow]) / (first[r] * n_steps[r]) for r in others) / len(others)
    if not math.isclose(as_first, truth, rel_tol=1e-6) and math.isclose(got, as_first, rel_tol=1e-6):
        raise harness.ExerciseFailure(
            f"{common}: you took every step to last as long as the first; this trace's steps do not "
            f"(here {sorted({e['dur'] for e in trace['traceEvents'] if e.get('ph') == 'X' and e['name'].startswith('ProfilerStep#')})} us): "
            f"add up the durations of all of the rank's ProfilerStep#N events")
    for count in range(1, len(covered) + 2):
        if count != len(others) and math.isclose(got, truth * len(others) / count, rel_tol=1e-6):
            raise harness.ExerciseFailure(
                f"{common}: you divided the sum of the {len(others)} other ranks' shares by {count}; this "
                f"trace has {len(covered)} ranks, so {len(others)} others: count the ranks of the trace "
                f"(the \"pid\"s of its complete events), do not write their number in")
    raise harness.ExerciseFailure(
        f"{common}: per other rank, (its time in collectives - the slow rank's) / the time of "
        f"its ProfilerStep#N events, then the mean over those ranks")


def _covered(events, sort=True, inside=False) -> float:
    """The time the ranges of ``events`` cover (in file order when ``sort`` is False: what a
    walk that forgot to sort them finds; ``inside``: what a walk that adds every range's end
    beyond the last one, even a range inside an earlier one, finds)."""
    ranges = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in events]
    total, end = 0.0, float("-inf")
    for a, b in (sorted(ranges) if sort else ranges):
        if b > end or inside:
            total += b - max(a, end)
            end = b
    return total


def _facts(trace):
    """Per rank: time in collectives (covered), steps' time, the trace's span of its events."""
    covered, steps_us, span_us = {}, {}, {}
    ranks = sorted({e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"})
    for rank in ranks:
        mine = [e for e in trace["traceEvents"] if e.get("pid") == rank and e.get("ph") == "X"]
        covered[rank] = _covered([e for e in mine if e["name"].startswith(("gloo:", "nccl:"))])
        steps = [e for e in mine if e["name"].startswith("ProfilerStep#")]
        steps_us[rank] = sum(e["dur"] for e in steps)
        span_us[rank] = max(e["ts"] + e["dur"] for e in steps) - min(e["ts"] for e in steps)
    return covered, steps_us, span_us


def built_trace(ranks=3, slow=2, prefix="gloo:", steps_ms=(100, 100), shuffle=False, inside=False):
    """A trace like ``known_trace``'s, varied: how many ranks, which one is slow, the
    collectives' names, steps of other lengths, events in no order, the second collective's
    range inside the first (a short one that ends before it)."""
    events, t0 = [], 0
    starts = {}
    early = [r for r in range(ranks) if r != slow]
    for i, rank in enumerate(early):
        starts[rank] = 15 + 50 * i / max(1, len(early))  # in % of the step: the others arrive early
    starts[slow] = 78  # the slow rank arrives last
    for rank in range(ranks):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
    for step, length in enumerate(steps_ms):
        dur = length * 1000
        for rank in range(ranks):
            # a rank's step ends a little after the collectives (its optimizer step): not all alike
            events.append({"ph": "X", "name": f"ProfilerStep#{step + 1}", "pid": rank, "tid": 1, "ts": t0,
                           "dur": dur + 3000 * rank})
            first = t0 + int(starts[rank] * dur / 100)
            end = t0 + dur - dur // 20
            ranges = [(first, end), (first + dur // 20, end - (dur // 10 if inside else -dur // 40))]
            for k, (a, b) in enumerate(ranges):
                events.append({"ph": "X", "name": "c10d::allreduce_", "pid": rank, "tid": 1, "ts": a - 10, "dur": 8})
                events.append({"ph": "X", "name": f"{prefix}all_reduce", "pid": rank, "tid": 7 + k, "ts": a,
                               "dur": b - a})
            events.append({"ph": "s", "name": "fwdbwd", "pid": rank, "tid": 1, "ts": t0 + 2000, "id": step})
        t0 += dur + 3000 * ranks + GAP_US
    if shuffle:
        random.Random(15).shuffle(events)
    return {"traceEvents": events, "displayTimeUnit": "ms"}


# (what the learner reads about the trace, how it is built): each answers a shortcut that the
# first trace (3 ranks, the last one slow, gloo, equal steps, in order) lets pass
VARIED_TRACES = [
    ("a trace of 4 ranks whose slow rank is rank 1", dict(ranks=4, slow=1)),
    ("a trace of 2 ranks whose slow rank is rank 0", dict(ranks=2, slow=0)),
    ("the trace of a GPU run (collectives named 'nccl:...')", dict(prefix="nccl:", slow=0)),
    ("a trace whose events are not in the order of their start times", dict(shuffle=True, slow=1)),
    ("a trace whose steps last 100 ms and 60 ms", dict(steps_ms=(100, 60), ranks=4, slow=3)),
    ("a trace where one collective's range lies inside another's", dict(inside=True, slow=0)),
]


def judge_trace(got, trace, slow, on):
    covered, steps_us, span_us = _facts(trace)
    assert min(covered, key=covered.get) == slow, f"check bug: {on} {covered}"
    explain_covered(got, trace, covered, on)
    explain_slow(got, trace, slow, covered, on)
    others = [r for r in covered if r != slow]
    truth = sum((covered[r] - covered[slow]) / steps_us[r] for r in others) / len(others)
    explain_fraction(got, trace, truth, slow, covered, steps_us, span_us, on)


def test_a_trace_whose_numbers_are_known():
    harness.judge_here(sys.modules[__name__], [KNOWN], harness.check_seed())


def known_cases() -> list:
    """``(trace, its ranks, on)``: the trace whose numbers are known, then the traces that
    expose shortcuts (the same every run)."""
    cases = [(known_trace(), list(TRUE_COVERED_US), "")]
    for description, how in VARIED_TRACES:
        trace = built_trace(**how)
        cases.append((trace, list(_facts(trace)[0]), f"in {description}: "))
    return cases


def judge_known(got):
    if not isinstance(got, list):
        raise harness.ExerciseFailure(f"the check's data should hold a list of traces' answers, got "
                                      f"{harness.describe(got)}")
    (trace, _, _), *varied = known_cases()
    first = got[0] if got else None
    explain_covered(first, trace, TRUE_COVERED_US)
    explain_slow(first, trace, TRUE_SLOW, TRUE_COVERED_US)
    covered, steps_us, span_us = _facts(trace)
    assert covered == TRUE_COVERED_US and math.isclose(TRUE_FRACTION, 0.5)  # the check's own sums
    explain_fraction(first, trace, TRUE_FRACTION, TRUE_SLOW, covered, steps_us, span_us)
    for index, ((trace, _, on), (_, how)) in enumerate(zip(varied, VARIED_TRACES), start=1):
        judge_trace(got[index] if index < len(got) else None, trace, how["slow"], on)


# --- a real run with a planted straggler -------------------------------------------------
SLOW, SLEEP_S, STEPS = 2, 0.08, dict(wait=1, warmup=1, active=3)


def traced_rank(folder):
    """One rank: a few steps of (compute, two all-reduces in flight at once), profiled;
    rank SLOW sleeps SLEEP_S in each. Writes and returns its Chrome trace's path."""
    import os
    import time

    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # no kineto ERROR line on a CPU-only machine
    rank = dist.get_rank()
    path = f"{folder}/rank{rank}.json"
    grads = [torch.ones(2 ** 18), torch.ones(2 ** 18)]
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(**STEPS),
                 on_trace_ready=lambda prof: prof.export_chrome_trace(path)) as prof:
        for step in range(sum(STEPS.values())):
            with record_function("compute"):
                x = torch.randn(128, 128)
                (x @ x).sum()
                if rank == SLOW:
                    time.sleep(SLEEP_S)
            works = [dist.all_reduce(g, async_op=True) for g in grads]
            for work in works:
                work.wait()
            prof.step()
    return path


def real_trace():
    """The merged trace of a real run (3 tries for the planted straggler to show), slimmed to
    what the judge reads: the complete events of the collectives and the profiler's steps."""
    from distkit.observe import tracing

    for attempt in range(3):
        with tempfile.TemporaryDirectory() as folder:
            paths = harness.run_ranks(traced_rank, folder, nproc=3)
            trace = tracing.merge([tracing.load(p) for p in paths])
        covered = _facts(trace)[0]
        if min(covered, key=covered.get) == SLOW:  # the planted straggler shows
            return trace, slimmed(trace)
    # a machine so loaded that another rank lost more time than the planted sleep
    pytest.skip(f"3 runs in which rank {SLOW}'s planted {SLEEP_S} s sleep did not make it the "
                f"slow rank (time in collectives: {covered}): the machine is too busy")


def slimmed(trace) -> dict:
    """The complete events of ``trace``'s collectives and profiler steps: all the judge reads."""
    return {"traceEvents": [{k: e[k] for k in ("ph", "name", "pid", "ts", "dur") if k in e}
                            for e in trace["traceEvents"] if e.get("ph") == "X"
                            and str(e.get("name")).startswith(("gloo:", "nccl:", "ProfilerStep#"))]}


def test_the_slow_rank_of_a_real_run_and_how_long_the_others_waited():
    harness.judge_here(sys.modules[__name__], [REAL], harness.check_seed())


def judge_real(got):
    trace = _at(got, "trace")
    problem = _not_the_checks_run(trace)
    if problem:
        raise harness.ExerciseFailure(f"the check's data holds no trace of the run the check makes ({problem}): "
                                      f"no marks")
    covered, steps_us, span_us = _facts(trace)
    explain_covered(got, trace, covered)
    explain_slow(got, trace, SLOW, covered)  # the rank the check slowed down
    others = [r for r in covered if r != SLOW]
    truth = sum((covered[r] - covered[SLOW]) / steps_us[r] for r in others) / len(others)
    explain_fraction(got, trace, truth, SLOW, covered, steps_us, span_us)


def _not_the_checks_run(trace):
    """What shows that ``trace`` is not a (slimmed) trace of :func:`traced_rank`'s run, or None."""
    if not (isinstance(trace, dict) and isinstance(trace.get("traceEvents"), list)) or not all(
            isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("name"), str)
            and isinstance(e.get("pid"), int) and all(_is_real_number(e.get(k)) for k in ("ts", "dur"))
            for e in trace["traceEvents"]):
        return "not a list of complete events"
    steps = [sum(1 for e in trace["traceEvents"] if e["pid"] == r and e["name"].startswith("ProfilerStep#"))
             for r in range(3)]
    if sorted({e["pid"] for e in trace["traceEvents"]}) != [0, 1, 2] or steps != [STEPS["active"]] * 3:
        return f"its ranks' profiled steps are {steps}, not {STEPS['active']} on each of 3 ranks"
    covered = _facts(trace)[0]
    if min(covered, key=covered.get) != SLOW:
        return f"rank {SLOW}, which the check slows down, is not the slow one: {covered}"
    return None


def _is_real_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# --- the check's two halves (harness.judge_here; distkit grade judges outside the sandbox) ---
# Every truth here is the check's own: it built the traces or planted the straggler and reads
# the facts from the trace. The reference's data is not needed; the learner's real run's
# trace comes with its answers (a run cannot be rebuilt from a seed).

KNOWN, REAL = "traces whose numbers are known", "the trace of a real run with a planted straggler"
PARTS = (KNOWN, REAL)


def collect(part, whos, seed):
    """``{who: what its functions gave}``: a list per known trace, or the real run's trace with
    what they gave on it (the reference's process makes no run: the judge does not need it)."""
    if part == KNOWN:
        return {who: [answers(harness.answer("15", who), trace, ranks, on) for trace, ranks, on in known_cases()]
                for who in whos}
    if tuple(whos) == (harness.REFERENCE,):
        return {harness.REFERENCE: None}
    full, slim = real_trace()
    ranks = list(_facts(slim)[0])
    return {who: {"trace": slim, **answers(harness.answer("15", who), full, ranks)} for who in whos}


def judge(part, got, expected, seed):
    """Raises the learner's :class:`harness.ExerciseFailure` where ``got`` is wrong (``expected``
    is not needed: the check knows each answer)."""
    if part == KNOWN:
        judge_known(got)
    else:
        judge_real(got)
