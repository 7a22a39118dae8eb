"""Checks for exercise 15: reading a merged trace. First a trace built by hand, whose
answer is known exactly; then the trace of a real run of 3 gloo processes in which the
check made rank 2 slow on purpose."""
import math

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


def _number(value, what):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise harness.ExerciseFailure(f"{what} returned {value!r} ({type(value).__name__}); "
                                      "return a number")
    return float(value)


def explain_covered(ex, trace, truth):
    for rank, want in truth.items():
        got = _number(ex.time_in_collectives(trace, rank), f"time_in_collectives(trace, {rank})")
        if math.isclose(got, want, rel_tol=1e-9):
            continue
        common = (f"time_in_collectives(trace, {rank}) returned {got:g} us, but rank {rank} had "
                  f"a collective running for {want:g} us")
        summed = sum(e["dur"] for e in trace["traceEvents"] if e.get("pid") == rank
                     and e.get("ph") == "X" and e["name"].startswith(("gloo:", "nccl:")))
        if math.isclose(got, summed, rel_tol=1e-9):
            raise harness.ExerciseFailure(
                f"{common}: you added up the durations, but two collectives in flight at once "
                f"(two gloo threads) overlap; count the time they COVER: sort the ranges by "
                f"start and add only what each adds beyond the ones before it")
        if got > want:
            raise harness.ExerciseFailure(
                f"{common}: did you count events that are not collectives (c10d::allreduce_ is "
                f"the main thread handing the work to gloo)? Keep the names that start with "
                f"COLLECTIVE_PREFIXES")
        raise harness.ExerciseFailure(f"{common}: keep every complete event (\"ph\": \"X\") of "
                                      f"that rank (\"pid\") whose name starts with COLLECTIVE_PREFIXES")


def explain_slow(ex, trace, truth_slow, covered):
    got = ex.slow_rank(trace)
    if got == truth_slow and not isinstance(got, bool):
        return
    busiest = max(covered, key=covered.get)
    hint = (" that is the rank that spent the MOST time in collectives: it arrived first and "
            "waited longest; the slow rank arrives last and waits least" if got == busiest else "")
    raise harness.ExerciseFailure(
        f"slow_rank returned {got!r}, but the others waited for rank {truth_slow} (time in "
        f"collectives per rank, us: {covered}):{hint or ' return the rank with the least time in collectives'}")


def explain_fraction(ex, trace, truth, slow, covered, steps_us, span_us):
    got = _number(ex.waited_fraction(trace), "waited_fraction(trace)")
    if math.isclose(got, truth, rel_tol=1e-6):
        return
    others = [r for r in covered if r != slow]
    raw = sum(covered[r] / steps_us[r] for r in others) / len(others)
    common = f"waited_fraction returned {got:.4g}, but the other ranks waited {truth:.4g} of their steps"
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
    n_steps = {r: sum(1 for e in trace["traceEvents"] if e.get("pid") == r and e.get("ph") == "X"
                      and e["name"].startswith("ProfilerStep#")) for r in others}
    per_step = sum((covered[r] - covered[slow]) / (steps_us[r] / n_steps[r])
                   for r in others) / len(others)
    whole = sum((covered[r] - covered[slow]) / span_us[r] for r in others) / len(others)
    if math.isclose(got, per_step, rel_tol=1e-6):
        raise harness.ExerciseFailure(
            f"{common}: you divided by ONE step, but the waiting was added up over all the "
            f"recorded steps; divide by the time of all of the rank's ProfilerStep#N events")
    if math.isclose(got, whole, rel_tol=1e-6):
        raise harness.ExerciseFailure(
            f"{common}: you divided by the trace's whole length, gaps between steps included; "
            f"divide by the time of the rank's ProfilerStep#N events")
    raise harness.ExerciseFailure(
        f"{common}: per other rank, (its time in collectives - the slow rank's) / the time of "
        f"its ProfilerStep#N events, then the mean over those ranks")


def _facts(trace):
    """Per rank: time in collectives (covered), steps' time, the trace's span of its events."""
    covered, steps_us, span_us = {}, {}, {}
    ranks = sorted({e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"})
    for rank in ranks:
        mine = [e for e in trace["traceEvents"] if e.get("pid") == rank and e.get("ph") == "X"]
        ranges = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in mine
                        if e["name"].startswith(("gloo:", "nccl:")))
        total, end = 0.0, float("-inf")
        for a, b in ranges:
            if b > end:
                total += b - max(a, end)
                end = b
        covered[rank] = total
        steps = [e for e in mine if e["name"].startswith("ProfilerStep#")]
        steps_us[rank] = sum(e["dur"] for e in steps)
        span_us[rank] = max(e["ts"] + e["dur"] for e in steps) - min(e["ts"] for e in steps)
    return covered, steps_us, span_us


def test_a_trace_whose_numbers_are_known():
    ex = harness.load("15")
    trace = known_trace()
    explain_covered(ex, trace, TRUE_COVERED_US)
    explain_slow(ex, trace, TRUE_SLOW, TRUE_COVERED_US)
    covered, steps_us, span_us = _facts(trace)
    assert covered == TRUE_COVERED_US and math.isclose(TRUE_FRACTION, 0.5)  # the check's own sums
    explain_fraction(ex, trace, TRUE_FRACTION, TRUE_SLOW, covered, steps_us, span_us)


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


@pytest.fixture(scope="module")
def real_trace(tmp_path_factory):
    from distkit import tracing

    for attempt in range(3):
        folder = tmp_path_factory.mktemp("traces")
        paths = harness.run_ranks(traced_rank, str(folder), nproc=3)
        trace = tracing.merge([tracing.load(p) for p in paths])
        covered = _facts(trace)[0]
        if min(covered, key=covered.get) == SLOW:  # the planted straggler shows
            return trace
    # a machine so loaded that another rank lost more time than the planted sleep
    pytest.skip(f"3 runs in which rank {SLOW}'s planted {SLEEP_S} s sleep did not make it the "
                f"slow rank (time in collectives: {covered}): the machine is too busy")


def test_the_slow_rank_of_a_real_run_and_how_long_the_others_waited(real_trace):
    ex = harness.load("15")
    covered, steps_us, span_us = _facts(real_trace)
    explain_covered(ex, real_trace, covered)
    explain_slow(ex, real_trace, SLOW, covered)  # the rank the check slowed down
    others = [r for r in covered if r != SLOW]
    truth = sum((covered[r] - covered[SLOW]) / steps_us[r] for r in others) / len(others)
    explain_fraction(ex, real_trace, truth, SLOW, covered, steps_us, span_us)
