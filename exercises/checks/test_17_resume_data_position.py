"""Checks for exercise 17: where each rank resumes when the world size changes.

The learner's three functions against the reference solution's, exactly, on the
docstring's example and on layouts drawn by Hypothesis (world sizes 1 to 4 before and
after, batches per rank 1 to 5, epochs whose size does not divide by the global batch,
stops anywhere, at an epoch's end too); the reference's dealing against
``DistributedSampler``'s own; and, end to end, the run resumed with the learner's
functions against the run that never stopped: every position of the epoch trained once,
the same global batches. A difference is described in the terms of the task (a position
trained twice, one skipped, a global batch changed); the usual mistakes are named once a
replay of them matches. Hypothesis draws the layouts from the check's seed
(``DISTKIT_CHECK_SEED`` replays them) and they are judged smallest first, so the first
failing layout is a small one: nothing is shrunk, because the check comes in two halves
(collect runs the answers on the layouts, judge draws the same layouts again and compares)
and distkit grade runs the halves in different processes.
"""
import functools
import math
import numbers
import sys
from dataclasses import astuple, dataclass

import pytest

import harness

pytestmark = pytest.mark.ex17

EXAMPLE = {"iteration": 5, "epoch_length": 4, "world_size": 2, "batch_per_rank": 3, "epoch_size": 22,
           "new_world_size": 3}
DRAWS = 150  # layouts per test: each draw calls pure functions, milliseconds


def is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class Stop:
    """A run of ``world_size`` x ``batch_per_rank`` stopped after ``iteration`` steps, to
    resume on ``new_world_size`` processes."""
    epoch_size: int
    world_size: int
    batch_per_rank: int
    iteration: int
    new_world_size: int

    @property
    def global_batch(self) -> int:
        return self.world_size * self.batch_per_rank

    @property
    def epoch_length(self) -> int:
        return math.ceil(self.epoch_size / self.global_batch)

    def __str__(self):
        return (f"an epoch of {self.epoch_size} positions, {self.world_size} process(es) of {self.batch_per_rank} "
                f"(a global batch of {self.global_batch}, {self.epoch_length} iterations per epoch), stopped at "
                f"iteration {self.iteration}, resumed on {self.new_world_size}")


def stops():
    from hypothesis import strategies as st

    @st.composite
    def draw_stop(draw):
        world, per_rank, size = draw(st.integers(1, 4)), draw(st.integers(1, 5)), draw(st.integers(1, 45))
        length = math.ceil(size / (world * per_rank))
        return Stop(size, world, per_rank, draw(st.integers(0, 3 * length)), draw(st.integers(1, 4)))

    return draw_stop()


# --- 1. resume_position ---------------------------------------------------------------

def position_case(iteration, epoch_length, world, per_rank) -> str:
    return f"resume_position(iteration={iteration}, epoch_length={epoch_length}, world_size={world}, " \
           f"batch_per_rank={per_rank})"


def check_position(got, want, iteration, epoch_length, world, per_rank, seed=None):
    """The answer's :func:`harness.outcome` against the reference's; returns the position."""
    args = (iteration, epoch_length, world, per_rank)
    want, got = tuple(harness.returned(want)), harness.returned(got)
    if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(is_int(v) for v in got)):
        raise harness.ExerciseFailure(f"{position_case(*args)} returned {got!r:.80} ({type(got).__name__}): "
                                      f"return (epoch, consumed), two ints")
    if tuple(got) == want:
        return want
    raise harness.ExerciseFailure(f"{position_case(*args)} returned {tuple(got)}, not {want}: "
                                  f"{why_position(tuple(got), want, *args)} {_replay(seed)}".rstrip())


def why_position(got, want, iteration, epoch_length, world, per_rank) -> str:
    epoch, consumed = want
    steps = iteration - epoch * epoch_length
    if epoch > 0 and steps == 0 and got == (epoch - 1, epoch_length * world * per_rank):
        return (f"after {iteration} steps epoch {epoch - 1} is over: the run resumes at the start of epoch {epoch}, "
                f"with nothing of it trained (consumed 0)")
    if got == (epoch + 1, consumed):
        return (f"the epoch is counted from 1 there (as ignite's engine.state.epoch counts); set_epoch counts from "
                f"0: after {iteration} steps of {epoch_length} per epoch the run is in epoch {epoch}")
    named = {steps * per_rank: f"that is ONE rank's share of the {steps} step(s) of this epoch: each step trained a "
                               f"GLOBAL batch, {world} x {per_rank} positions",
             steps: f"that counts the {steps} step(s) trained in this epoch, not the positions they covered "
                    f"({world} x {per_rank} each)",
             iteration * world * per_rank: f"that counts the positions of every step since the start; the earlier "
                                           f"epochs' do not count: only the {steps} step(s) of epoch {epoch}"}
    if got[0] == epoch and got[1] in named and got[1] != consumed:
        return named[got[1]]
    if got[0] != epoch:
        return f"after {iteration} steps of {epoch_length} per epoch the run is in epoch {epoch} (counted from 0)"
    return f"epoch {epoch} is right; {steps} step(s) of it were trained, {world} x {per_rank} positions each"


def _replay(seed) -> str:
    if seed is None:
        return ""
    return f"(a layout drawn by Hypothesis from seed {seed}: DISTKIT_CHECK_SEED={seed} replays it)"


def test_resume_position():
    harness.judge_here(sys.modules[__name__], [POSITION], harness.check_seed())


def position_cases(seed) -> list:
    """``(args, seed)`` of each call the check judges: the example, a stop at an epoch's end
    (the same every run, no seed to name), then the drawn layouts."""
    e = EXAMPLE
    fixed = [(e["iteration"], e["epoch_length"], e["world_size"], e["batch_per_rank"]), (8, 4, 2, 3)]
    drawn = [(s.iteration, s.epoch_length, s.world_size, s.batch_per_rank) for s in drawn_stops(seed)]
    return [(args, None) for args in fixed] + [(args, seed) for args in drawn]


@functools.lru_cache(maxsize=8)
def drawn_stops(seed) -> tuple:
    """DRAWS layouts drawn by Hypothesis from ``seed``, the smallest first: the collector and
    the judge draw the same ones (nothing is shrunk, so the first failing is a small one)."""
    found = []

    def note(stop):
        found.append(stop)

    drawn_with(seed, note)()
    return tuple(sorted(set(found), key=lambda s: (sum(astuple(s)), astuple(s))))


def drawn_with(seed, test):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed

    return hypothesis_seed(seed)(settings(
        max_examples=DRAWS, deadline=None, database=None, derandomize=False, report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck))(given(stops())(test)))


# --- 2. new_batch_per_rank ------------------------------------------------------------

def batch_case(world, per_rank, new_world) -> str:
    return f"new_batch_per_rank(world_size={world}, batch_per_rank={per_rank}, new_world_size={new_world})"


def _refused(result) -> bool:
    """Whether a :func:`harness.outcome` is a ValueError (the refusal the task asks for)."""
    return isinstance(result, dict) and "returned" not in result and "ValueError" in list(result.get("classes", ()))


def check_new_batch(got, want, world, per_rank, new_world, seed=None):
    """The answer's :func:`harness.outcome` against the reference's; returns the new batch per
    rank, None where the reference refuses."""
    case = batch_case(world, per_rank, new_world)
    global_batch = world * per_rank
    want = None if _refused(want) else harness.returned(want)
    if _refused(got):
        if want is None:
            return None
        raise harness.ExerciseFailure(
            f"{case} raised ValueError ({got.get('text')}), but the global batch of {global_batch} divides by "
            f"{new_world}: {want} per rank keeps it {_replay(seed)}".rstrip())
    if isinstance(got, dict) and "returned" not in got and isinstance(got.get("raised"), str):
        raise harness.ExerciseFailure(
            f"{case} raised {got['raised']}: {got.get('text')}; "
            + (f"raise ValueError when the global batch ({global_batch}) does not divide by the new world size"
               if want is None else f"the global batch of {global_batch} divides by {new_world}"))
    got = harness.returned(got)
    if want is None:
        raise harness.ExerciseFailure(f"{case} returned {got!r}: {why_not_refused(got, global_batch, new_world)}")
    if is_int(got) and got == want:
        return want
    raise harness.ExerciseFailure(f"{case} returned {got!r}, not {want}: "
                                  f"{why_batch(got, want, per_rank, global_batch, new_world)} {_replay(seed)}".rstrip())


def why_not_refused(got, global_batch, new_world) -> str:
    trained = got * new_world if is_int(got) else None
    if trained is not None and trained != global_batch:
        return (f"{new_world} processes of {got} train {trained} positions a step, not the global batch of "
                f"{global_batch}: the run would quietly train other batches. No whole batch per rank keeps "
                f"{global_batch}: raise ValueError naming the global batch and the world size")
    return (f"no whole batch per rank keeps the global batch of {global_batch} on {new_world} processes: raise "
            f"ValueError naming the global batch and the world size")


def why_batch(got, want, per_rank, global_batch, new_world) -> str:
    if isinstance(got, float) and got == want:
        return "a batch size is a whole number: return an int, not a float"
    if not isinstance(got, numbers.Real) or isinstance(got, bool):
        return f"return each new rank's batch, an int (that is {harness.describe(got)})"
    if got == per_rank:
        return (f"that is the old batch per rank: {new_world} processes of {per_rank} would train a global batch of "
                f"{new_world * per_rank}, not {global_batch}")
    if got == global_batch:
        return f"that is the whole global batch; each of the {new_world} processes takes its share of it"
    return f"{new_world} processes of {got!r} do not make the global batch of {global_batch}"


def test_new_batch_per_rank():
    harness.judge_here(sys.modules[__name__], [NEW_BATCH], harness.check_seed())


def batch_cases(seed) -> list:
    fixed = [(EXAMPLE["world_size"], EXAMPLE["batch_per_rank"], EXAMPLE["new_world_size"]),
             (2, 3, 4),  # 6 does not divide by 4
             (4, 1, 1)]
    drawn = [(s.world_size, s.batch_per_rank, s.new_world_size) for s in drawn_stops(seed)]
    return [(args, None) for args in fixed] + [(args, seed) for args in drawn]


# --- 3. rank_batches ------------------------------------------------------------------

def rank_cases(consumed, size, world, per_rank) -> list:
    return [f"rank_batches(consumed={consumed}, epoch_size={size}, rank={rank}, world_size={world}, "
            f"batch_per_rank={per_rank})" for rank in range(world)]


def ranks_outcomes(ex, consumed, size, world, per_rank) -> list:
    """Every rank's :func:`harness.outcome` of ``ex.rank_batches``, up to the first that raised."""
    found = []
    for rank, case in enumerate(rank_cases(consumed, size, world, per_rank)):
        found.append(harness.outcome(case, ex.rank_batches, consumed, size, rank, world, per_rank))
        if "returned" not in found[-1]:
            break
    return found


def answer_batches(outcomes, consumed, size, world, per_rank) -> list:
    """Every rank's answer, checked to be a list of lists of ints."""
    out = []
    if not isinstance(outcomes, list):
        raise harness.ExerciseFailure(f"the check's data should hold every rank's batches, got "
                                      f"{harness.describe(outcomes)}")
    for rank, case in enumerate(rank_cases(consumed, size, world, per_rank)):
        got = harness.returned(outcomes[rank] if rank < len(outcomes) else None)
        if not isinstance(got, list):
            raise harness.ExerciseFailure(f"{case} returned {harness.describe(got)}: return a list of batches, "
                                          f"each a list of ints (positions)")
        for j, batch in enumerate(got):
            if not (isinstance(batch, list) and all(is_int(p) for p in batch)):
                what = "an int: return the positions in batches, a list per batch" if is_int(batch) \
                    else harness.describe(batch)
                raise harness.ExerciseFailure(f"{case}: its batch {j} is {what} (return a list of lists of ints)")
        out.append((case, [[int(p) for p in batch] for batch in got]))
    return out


def judge_batches(got, want, consumed, size, world, per_rank, seed=None, before=""):
    """The learner's batches for every rank (the outcomes ``got``) against the run that never
    stopped, then against the reference's dealing (``want``); the first difference is the
    learner's message."""
    answers = answer_batches(got, consumed, size, world, per_rank)
    where = f"{before}on {world} process(es) of {per_rank}, resuming after position {consumed} of {size}"
    tail = _replay(seed)
    trained = {p: "before the stop" for p in range(consumed)}
    for rank, (case, batches) in enumerate(answers):
        for j, batch in enumerate(batches):
            if not batch:
                raise harness.ExerciseFailure(f"{where}: {case}'s batch {j} is empty; a rank with nothing left has "
                                              f"one batch fewer {tail}".rstrip())
            for p in batch:
                if not 0 <= p < size:
                    raise harness.ExerciseFailure(
                        f"{where}: rank {rank}'s batch {j} holds position {p}, outside the epoch (0 to {size - 1}): "
                        f"the epoch's last global batch is short, not filled up {tail}".rstrip())
                if p in trained:
                    first = trained[p]
                    why = ("those were trained before the stop: start after them" if first == "before the stop"
                           else "count every position once, even in the epoch's short last batch")
                    raise harness.ExerciseFailure(f"{where}: position {p} is trained twice, {first} and by rank "
                                                  f"{rank} in its batch {j}: {why} {tail}".rstrip())
                trained[p] = f"by rank {rank} in its batch {j}"
    missing = sorted(set(range(size)) - set(trained))
    if missing:
        raise harness.ExerciseFailure(
            f"{where}: {len(missing)} position(s) are never trained ({harness.short_list(missing)}), the epoch's "
            f"last of them {size - 1}: every position left after the stop is trained once, a short last global "
            f"batch too {tail}".rstrip())
    judge_global_batches(answers, consumed, size, world, per_rank, where, tail)
    for rank, ((case, batches), wanted) in enumerate(zip(answers, want)):
        want = harness.returned(wanted)
        if batches != want:
            j = next(j for j, (a, b) in enumerate(zip(batches, want)) if a != b)
            raise harness.ExerciseFailure(
                f"{where}: every position is trained once, in the right global batches, but {case}'s batch {j} is "
                f"{batches[j]}, and DistributedSampler deals that rank {want[j]}: of each global batch, counted "
                f"from its first position, rank r takes the positions r, r + {world}, r + {2 * world}, ..., as the "
                f"sampler does (the kit's loader is the sampler) {tail}".rstrip())


def judge_global_batches(answers, consumed, size, world, per_rank, where, tail):
    """Step j after the resume trains what the run that never stopped trained then."""
    global_batch = world * per_rank
    steps = max(len(batches) for _, batches in answers)
    for j in range(steps):
        start = consumed + j * global_batch
        want = set(range(start, min(start + global_batch, size)))
        got = {p for _, batches in answers if j < len(batches) for p in batches[j]}
        if got != want:
            raise harness.ExerciseFailure(
                f"{where}: step {j} after the resume trains positions {harness.short_list(sorted(got))}, but the run "
                f"that never stopped trained {harness.short_list(sorted(want))} at that step (a global batch of "
                f"{global_batch} consecutive positions, every rank's batch j together) {tail}".rstrip())


def sampler_batches(size, rank, world, per_rank, skip) -> list:
    """What a real DistributedSampler (in order) and a loader of ``per_rank`` give ``rank``,
    less its first ``skip`` batches: what a run resumed after ``skip`` steps trains."""
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    sampler = DistributedSampler(range(size), num_replicas=world, rank=rank, shuffle=False)
    loader = DataLoader(range(size), batch_size=per_rank, sampler=sampler)
    return [[int(p) for p in batch] for batch in loader][skip:]


def test_rank_batches():
    harness.judge_here(sys.modules[__name__], [BATCHES], harness.check_seed())


def rank_batch_cases(seed) -> list:
    """``(consumed, epoch size, world size, batch per rank, seed, sampler)`` of each case:
    the example, then the drawn layouts, each with the inputs on which the reference's
    dealing is compared with a real DistributedSampler's (``sampler``: an epoch the sampler
    does not pad, resumed between batches)."""
    cases = [(6, EXAMPLE["epoch_size"], EXAMPLE["new_world_size"], 2, None, None)]
    for stop in drawn_stops(seed):
        world, per_rank = stop.world_size, stop.batch_per_rank
        size = stop.epoch_size - stop.epoch_size % world or world  # the sampler pads no epoch that divides
        skip = min(stop.iteration, math.ceil(size / (world * per_rank)))
        consumed = min(stop.iteration, stop.epoch_size)  # anywhere in the epoch, not only between batches
        cases.append((consumed, stop.epoch_size, world, per_rank, seed, (size, skip)))
    return cases


def sampler_check(want, case) -> None:
    """The reference's dealing (``want``) against a real DistributedSampler's."""
    _, _, world, per_rank, _, (size, skip) = case
    for rank in range(world):
        assert harness.returned(want[rank]) == sampler_batches(size, rank, world, per_rank, skip), \
            f"check bug: the reference deals {size} positions other than the sampler ({case})"


# --- 4. the whole resume against the run that never stopped ----------------------------

def test_a_resumed_run_trains_every_position_once_in_the_same_global_batches():
    harness.judge_here(sys.modules[__name__], [WHOLE], harness.check_seed())


def whole_cases(seed) -> list:
    """``(stop, seed)``: the example, then the drawn layouts."""
    example = Stop(EXAMPLE["epoch_size"], EXAMPLE["world_size"], EXAMPLE["batch_per_rank"], EXAMPLE["iteration"],
                   EXAMPLE["new_world_size"])
    return [(example, None)] + [(stop, seed) for stop in drawn_stops(seed)]


def whole_outcomes(ex, stop) -> dict:
    """A resume with ``ex``'s functions: where it stands, the new batch per rank, and each
    new rank's batches from there (only where the first two gave a position and a batch)."""
    args = (stop.iteration, stop.epoch_length, stop.world_size, stop.batch_per_rank)
    found = {"position": harness.outcome(position_case(*args), ex.resume_position, *args)}
    args = (stop.world_size, stop.batch_per_rank, stop.new_world_size)
    found["batch"] = harness.outcome(batch_case(*args), ex.new_batch_per_rank, *args)
    position, per_rank = found["position"].get("returned"), found["batch"].get("returned")
    if isinstance(position, (tuple, list)) and len(position) == 2 and is_int(position[1]) and is_int(per_rank) \
            and per_rank > 0:
        found["batches"] = ranks_outcomes(ex, position[1], stop.epoch_size, stop.new_world_size, per_rank)
    return found


def judge_whole(got, want, stop, seed):
    got, want = _dict(got), _dict(want)
    epoch, consumed = check_position(got.get("position"), want["position"], stop.iteration, stop.epoch_length,
                                     stop.world_size, stop.batch_per_rank, seed)
    per_rank = check_new_batch(got.get("batch"), want["batch"], stop.world_size, stop.batch_per_rank,
                               stop.new_world_size, seed)
    if per_rank is None:
        return  # refused: the global batch does not divide by the new world size
    judge_batches(got.get("batches"), want["batches"], consumed, stop.epoch_size, stop.new_world_size, per_rank,
                  seed, before=f"{stop}: in epoch {epoch}, ")


# --- the check's two halves (harness.judge_here; distkit grade judges outside the sandbox) ---

POSITION, NEW_BATCH, BATCHES = "resume_position", "new_batch_per_rank", "rank_batches"
WHOLE = "a resumed run against the run that never stopped"
PARTS = (POSITION, NEW_BATCH, BATCHES, WHOLE)


def _failed(result, refusal_ok=False) -> bool:
    """Whether a case's data fails whatever the reference gave: an answer raised (a refusal of
    new_batch_per_rank aside). The judge stops there, so the collector stops there too."""
    if isinstance(result, list):
        return any(_failed(r) for r in result)
    if not isinstance(result, dict):
        return False
    if "raised" in result:
        return not (refusal_ok and _refused(result))
    return any(_failed(v, k == "batch") for k, v in result.items() if k != "returned")


def collect(part, whos, seed):
    """``{who: [the outcome of each case, in order]}``; a who's list ends at its first call that
    raised (the judge stops there)."""
    found = {}
    for who in whos:
        ex, results = harness.answer("17", who), []
        for case in CASES[part](seed):
            results.append(COLLECT[part](ex, case, who))
            if _failed(results[-1], part == NEW_BATCH):
                break
        found[who] = results
    return found


def _collect_batches(ex, case, who):
    consumed, size, world, per_rank, _, sampler = case
    found = {"batches": ranks_outcomes(ex, consumed, size, world, per_rank)}
    if sampler is not None and who == harness.REFERENCE:
        size, skip = sampler
        found["sampler"] = ranks_outcomes(ex, skip * world * per_rank, size, world, per_rank)
    return found


CASES = {POSITION: position_cases, NEW_BATCH: batch_cases, BATCHES: rank_batch_cases, WHOLE: whole_cases}
COLLECT = {
    POSITION: lambda ex, case, who: harness.outcome(position_case(*case[0]), ex.resume_position, *case[0]),
    NEW_BATCH: lambda ex, case, who: harness.outcome(batch_case(*case[0]), ex.new_batch_per_rank, *case[0]),
    BATCHES: _collect_batches,
    WHOLE: lambda ex, case, who: whole_outcomes(ex, case[0]),
}


def _dict(value) -> dict:
    if not isinstance(value, dict):
        raise harness.ExerciseFailure(f"the check's data should hold a dict per case, got {harness.describe(value)}")
    return value


def judge(part, got, expected, seed):
    """Raises the learner's :class:`harness.ExerciseFailure` where ``got`` differs from ``expected``."""
    if not isinstance(got, list):
        raise harness.ExerciseFailure(f"the check's data should hold a list of cases, got {harness.describe(got)}")
    for i, (case, want) in enumerate(zip(CASES[part](seed), expected)):
        result = got[i] if i < len(got) else None
        if part == POSITION:
            check_position(result, want, *case[0], case[1])
        elif part == NEW_BATCH:
            check_new_batch(result, want, *case[0], case[1])
        elif part == BATCHES:
            if case[5] is not None:
                sampler_check(want["sampler"], case)
            judge_batches(_dict(result).get("batches"), want["batches"], *case[:5])
        else:
            judge_whole(result, want, *case)
