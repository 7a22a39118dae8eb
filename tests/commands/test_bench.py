"""``distkit bench``: the method (interleaving, medians, ratios), the fairness of the
hand-written baselines, and the real command end to end in its tiny mode (every
measurement, 2 gloo processes, JSON and PNG written).

The 3% targets are recorded in the results, never asserted here: a shared CI machine's
noise is larger than the effect."""
from __future__ import annotations

import json
import math
import os
import random
import statistics
import subprocess
import sys

import pytest
import torch
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from distkit import bench
from distkit.config import Config

SEED = int(os.environ.get("DISTKIT_TEST_SEED") or random.randrange(2**32))
print(f"tests/commands/test_bench.py: Hypothesis seed {SEED} (reproduce: "
      f"DISTKIT_TEST_SEED={SEED} python -m pytest tests/commands/test_bench.py)", file=sys.stderr)


# --- the method ----------------------------------------------------------------------

def test_interleaved_discards_warmup_and_rotates_the_order_each_round():
    calls = []

    def side(name, samples, seconds):
        def run():
            calls.append(name)
            return samples, seconds
        return run

    rates = bench.interleaved({"A": side("A", 10, 0.5), "B": side("B", 30, 1.5)},
                              repeats=4, warmup=1)
    assert calls == ["A", "B",  # warm-up, discarded
                     "A", "B", "B", "A", "A", "B", "B", "A"]
    assert rates == {"A": [20.0] * 4, "B": [20.0] * 4}


def test_compare_takes_the_median_of_the_rounds_ratios_and_checks_the_target():
    # round 2 ran while the machine was slow for both sides: its ratio is still ~1
    out = bench.compare([90.0, 50.0, 95.0], [100.0, 50.5, 99.0], target=0.03,
                        kit_cpu=[10.0, 10.0, 9.0], hand_cpu=[10.0, 10.0, 10.0])
    assert out["ratio"] == pytest.approx(95.0 / 99.0)  # median of 0.90, 0.990, 0.960
    assert out["cost"] == pytest.approx(1 - 95.0 / 99.0)
    assert out["ratio_of_medians"] == pytest.approx(90.0 / 99.0)
    assert out["cpu_ratio"] == pytest.approx(1.0)
    assert out["within_target"] is False
    assert bench.compare([98.0], [100.0], target=0.03)["within_target"] is True


def test_targets_missed_names_each_measurement_over_its_target():
    results = {"overhead": bench.compare([90.0], [100.0], 0.03),
               "ddp": bench.compare([99.0], [100.0], 0.03),
               "gpu": {"skipped": "no CUDA device"},
               "hangs": {"cost": 0.03, "target_cost": 0.02, "within_target": False}}
    assert bench.targets_missed(results) == ["overhead", "hangs"]


# --- fairness of the hand-written baseline -------------------------------------------

def test_kit_trainer_and_handwritten_loop_do_the_same_work_step_for_step():
    """Same model, seed, batches, lr schedule: the kit's trainer (``create_trainer`` plus
    the handlers ``training()`` adds) and the hand-written loop end with bit-identical
    weights, so the baseline leaves out no work the kit does to its model."""
    torch.set_num_threads(1)
    config = Config(dataset="synthetic", model="cnn", batch_size=16, epochs=2, progress_bar=False)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 1, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g))
               for _ in range(3)]
    from distkit.train.training import initialize

    model, optimizer, criterion = initialize(config)
    kit = bench.KitRun(model, optimizer, criterion, batches, config)
    assert kit(epochs=2) == 2 * 3 * 16
    hand_model, hand_opt, hand_loss = bench.handwritten_setup(config, torch.device("cpu"))
    samples = bench.handwritten_epochs(hand_model, hand_opt, hand_loss, batches, epochs=2,
                                       scheduler=bench.linear_decay(hand_opt, 2 * 3))
    assert samples == 2 * 3 * 16
    kit_state, hand_state = model.state_dict(), hand_model.state_dict()
    assert list(kit_state) == list(hand_state)
    for name in kit_state:
        assert torch.equal(kit_state[name], hand_state[name]), name
    # and the weights did move: a loop that did nothing would not match by accident
    assert not torch.equal(kit_state["head.3.weight"], initialize(config)[0].state_dict()["head.3.weight"])


def test_gpu_measurement_code_runs_on_the_cpu_when_forced():
    """The GPU comparison cannot run here; its code path (ResNet-18, bf16 autocast,
    channels_last, both sides) still must."""
    settings = bench.MODES["tiny"]
    out = bench.measure_gpu(settings, force=True)
    assert out["device"] == "cpu (forced)" and out["amp"] == "bfloat16"
    kit, hand = out["sides"]["kit"]["samples_per_s"], out["sides"]["hand-written"]["samples_per_s"]
    assert len(kit) == len(hand) == settings.repeats
    assert out["ratio"] == pytest.approx(statistics.median([k / h for k, h in zip(kit, hand)]))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU answer")
def test_gpu_measurement_says_it_is_skipped_without_cuda():
    assert bench.measure_gpu(bench.MODES["tiny"]) == {"skipped": "no CUDA device"}


# --- bad input: one line, before any measuring ----------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--only", "overhead,bogus"], "unknown measurement bogus: choose from overhead, ddp, scaling, data, gpu, peers, hangs"),
    (["--threads", "0"], "--threads must be >= 1, got 0"),
])
def test_bad_input_fails_in_one_line(args, message, capsys, tmp_path):
    from distkit.commands import main

    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--tiny", "--output", str(tmp_path / "out"), *args])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err == f"distkit: error: {message}\n"
    assert not (tmp_path / "out" / "bench-tiny.json").exists()


def test_an_output_path_that_is_a_file_fails_before_measuring(capsys, tmp_path):
    from distkit.commands import main

    target = tmp_path / "a-file"
    target.write_text("")
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--tiny", "--only", "gpu", "--output", str(target)])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err.startswith(f"distkit: error: cannot create --output '{target}'")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU answer")
def test_check_passes_when_nothing_was_compared(capsys, tmp_path):
    """Without CUDA the GPU comparison is skipped, so ``--check`` has no target to miss."""
    from distkit.commands import main

    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--tiny", "--only", "gpu", "--check", "--output", str(tmp_path)])
    assert exit_info.value.code == 0
    assert "5 GPU (ResNet-18, bf16, channels_last): skipped: no CUDA device" in capsys.readouterr().out
    with open(tmp_path / "bench-tiny.json") as f:
        assert json.load(f)["gpu"] == {"skipped": "no CUDA device"}


# --- the real command, end to end -----------------------------------------------------

@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from support import subprocess_env

    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run([sys.executable, "-m", "distkit", "bench", "--tiny", "--output", str(out),
                           "--only", "overhead,ddp,scaling,data,gpu,hangs",
                           "--note", "test run"], cwd=out, env=subprocess_env(),
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "bench-tiny.json") as f:
        return proc, json.load(f), out


def _check_side(side, repeats):
    rates = side["samples_per_s"]
    assert len(rates) == repeats
    assert all(math.isfinite(r) and r > 0 for r in rates)
    assert side["median"] == pytest.approx(statistics.median(rates))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_tiny_prints_the_table_and_writes_json_and_png(tiny_run):
    proc, results, out = tiny_run
    assert (out / "bench-tiny.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.glob("*.tmp*"))  # written to a temporary name, then renamed
    for line in ("1 overhead, 1 process", "2 DDP overhead, 2 gloo processes", "3 scaling",
                 "4 data pipeline", "7 hang records", "results: "):
        assert line in proc.stdout, line
    if not torch.cuda.is_available():
        assert "5 GPU (ResNet-18, bf16, channels_last): skipped: no CUDA device" in proc.stdout
        assert results["gpu"] == {"skipped": "no CUDA device"}
    # machine, versions, method and targets are recorded beside the numbers
    assert results["versions"]["torch"] == torch.__version__
    assert results["machine"]["cores"] >= 1 and results["note"] == "test run"
    assert results["targets"] == {"overhead": 0.03, "ddp": 0.03, "gpu": 0.05, "hangs": 0.02}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_tiny_ratios_come_from_the_measured_rates(tiny_run):
    _, results, _ = tiny_run
    repeats = results["settings"]["repeats"]
    for name in ("overhead", "ddp"):
        m = results[name]
        kit, hand = m["sides"]["kit"], m["sides"]["hand-written"]
        _check_side(kit, repeats)
        _check_side(hand, repeats)
        assert kit["samples_per_s"] != hand["samples_per_s"]  # two real timings, not a constant
        rounds = [k / h for k, h in zip(kit["samples_per_s"], hand["samples_per_s"])]
        assert m["ratio"] == pytest.approx(statistics.median(rounds))
        assert m["ratio_of_medians"] == pytest.approx(kit["median"] / hand["median"])
        assert m["within_target"] == (m["ratio"] >= 1 - m["target_cost"])
    assert results["ddp"]["world_size"] == 2 and results["ddp"]["backend"] == "gloo"
    per = results["ddp"]["per_step_us"]
    rounds = per["cpu_us_per_step_per_process_rounds"]
    assert per["kit_extra_cpu_us_per_step_per_process"] == pytest.approx(statistics.median(
        k - h for k, h in zip(rounds["kit"], rounds["hand-written"])))  # paired, round by round
    variants = results["overhead"]["variants"]
    assert set(variants) == {"kit", "kit: create_trainer only", "kit + progress bar"}
    per = results["overhead"]["per_step_us"]
    assert set(per["kit_extra_cpu_us_per_step"]) == set(variants)
    assert all(us > 0 for us in per["cpu_us_per_step"].values())
    rounds = per["cpu_us_per_step_rounds"]
    for name, extra in per["kit_extra_cpu_us_per_step"].items():
        assert extra == pytest.approx(statistics.median(
            k - h for k, h in zip(rounds[name], rounds["hand-written"])))
    for name, cmp in variants.items():
        side = results["overhead"]["sides"][name]
        hand_cpu = results["overhead"]["sides"]["hand-written"]["samples_per_cpu_s"]
        assert cmp["cpu_ratio"] == pytest.approx(statistics.median(
            [k / h for k, h in zip(side["samples_per_cpu_s"], hand_cpu)]))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_tiny_scaling_reports_efficiency_and_allreduced_bytes(tiny_run):
    _, results, _ = tiny_run
    s = results["scaling"]
    assert s["world_sizes"] == [1, 2]
    for name, m in s["models"].items():
        points = {p["variant"]: p for p in m["points"]}
        for p in points.values():
            _check_side(p, results["settings"]["study_repeats"])
        assert points["weak"]["global_batch"] == 2 * points["strong"]["global_batch"]
        assert points["oversubscribed"]["threads_per_process"] > points["strong"]["threads_per_process"]
        assert m["strong_efficiency"] == pytest.approx(
            points["strong"]["median"] / (2 * points["1 process"]["median"]))
        assert m["weak_efficiency"] == pytest.approx(
            points["weak"]["median"] / (2 * points["1 process"]["median"]))
        # what DDP's communication hook counted is every gradient, 4 bytes a parameter
        assert m["allreduce_bytes_per_step_measured"] == m["allreduce_bytes_per_step"] == 4 * m["parameters"]
    # the pool waits on a queue while this process measures: waiting must not spin a core
    idle = results["pool"]["pool_idle"]
    assert idle["idle_cpu_s"] < 0.5 * idle["idle_wall_s"] + 1.0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_tiny_data_pipeline_verdicts_follow_the_medians(tiny_run):
    _, results, _ = tiny_run
    d = results["data"]
    workers = d["num_workers"]
    assert workers[0] == 0 and len(workers) >= 2
    for pname, p in d["pipelines"].items():
        assert set(p["loader"]) >= {f"workers={w} pin=False" for w in workers}
        zero = p["loader"]["workers=0 pin=False"]["median"]
        for model, verdict in p["verdict"].items():
            compute = p["compute"][model]["median"]
            assert verdict["data_bound_with_0_workers"] == (zero < compute)
            assert verdict["compute_ms_per_batch"] == pytest.approx(1000 * d["batch_size"] / compute)


# --- the hang records' cost ------------------------------------------------------------

def _hang_rounds(draw_round, rounds):
    """Rank 0's results of ``rounds`` rounds, as :func:`distkit.bench.hangs._ranks` returns
    them: every off block's step takes ``step`` s, the recorder adds ``recorder`` (a
    fraction), one more watcher adds ``watcher`` s; the machine's drift ``drift[b]`` hits
    block b of both sides alike."""
    out = []
    for r in range(rounds):
        step, recorder, watcher, drift = draw_round(r)
        sides = {}
        for side, scale in (("off", 1.0), ("on", 1.0 + recorder)):
            rows = [{"watcher": (b % 4) in (1, 2),
                     "step_cpu_s": step * scale + drift[b] + (watcher if (b % 4) in (1, 2) else 0.0),
                     "step_wall_s": 2 * step * scale + drift[b] + (watcher if (b % 4) in (1, 2) else 0.0)}
                    for b in range(len(drift))]
            sides[side] = {"rows": rows, "entries_per_step": 3.0 if side == "on" else 0.0,
                           "alone_cpu_s": [1e-5 * scale] * 2, "watcher_poll_cpu_s": 2e-5}
        out.append(sides)
    return out


def test_hang_records_whole_steps_pair_each_watcher_block_with_the_plain_block_beside_it():
    """Drawn steps, costs and drift (seed printed at the top): the recorder's fraction is
    the rounds' off/on pair, the watcher's the extra-watcher block minus the plain block
    beside it, whatever the drift between pairs; and the pieces add up as documented."""
    from distkit.bench.hangs import pieces, whole_steps

    @seed(SEED)
    @settings(max_examples=40, deadline=None, database=None)
    @given(step=st.floats(1e-4, 1e-2), recorder=st.floats(0.0, 0.5), watcher=st.floats(0.0, 1e-4),
           pairs=st.lists(st.floats(0.0, 1e-2), min_size=1, max_size=4), rounds=st.integers(1, 5))
    def check(step, recorder, watcher, pairs, rounds):
        drift = [d for d in pairs for _ in range(2)]  # the same drift within a pair of blocks
        got = _hang_rounds(lambda r: (step, recorder, watcher, drift), rounds)
        w = whole_steps(got)
        off_cpu = w["step_cpu_s"]["recorder_off_s"]
        assert w["step_cpu_s"]["watcher"]["median"] == pytest.approx(watcher / off_cpu, abs=1e-9)
        p = pieces(got)
        assert p["entries_per_step"] == 3.0
        assert p["recorder_us_per_step"] == pytest.approx(3 * 1e6 * recorder * 1e-5)
        assert p["cpu_fraction"] == pytest.approx(
            (3 * recorder * 1e-5 + 10 * p["step_wall_us"] / 1e6 * 2e-5) / (p["step_cpu_us"] / 1e6))
        if len(set(drift)) == 1:  # no drift between pairs: the off/on pair is exactly the recorder
            assert w["step_cpu_s"]["recorder"]["median"] == pytest.approx(
                recorder * step / (step + drift[0]), rel=1e-6, abs=1e-12)

    check()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_tiny_hang_records_cost_comes_from_the_measured_pieces(tiny_run):
    """The recorder was really off and on (entries counted in each launch); the cost is
    the measured pieces over the measured recorder-off step, held to 2 %."""
    proc, results, _ = tiny_run
    h = results["hangs"]
    assert len(h["rounds"]) == results["settings"]["hang_rounds"]
    for r in h["rounds"]:
        assert r["off"]["recorded_entries"] == 0 and r["off"]["entries_per_step"] == 0
        assert r["on"]["recorded_entries"] > 0 and r["on"]["entries_per_step"] >= 1  # DDP's bucket
        for side in ("off", "on"):
            assert len(r[side]["rows"]) == 2 * results["settings"]["hang_blocks"]
            assert all(row["step_cpu_s"] > 0 and row["step_wall_s"] > 0 for row in r[side]["rows"])
            assert r[side]["watcher_poll_cpu_s"] >= 0
    p = h["pieces"]
    rounds = h["rounds"]
    entry = statistics.median(statistics.median(r["on"]["alone_cpu_s"]) - statistics.median(r["off"]["alone_cpu_s"])
                              for r in rounds)
    assert p["recorder_cpu_us_per_entry"] == pytest.approx(1e6 * entry)
    step_cpu = statistics.median(statistics.median(row["step_cpu_s"] for row in r["off"]["rows"]
                                                   if not row["watcher"]) for r in rounds)
    assert p["step_cpu_us"] == pytest.approx(1e6 * step_cpu)
    extra = p["entries_per_step"] * entry + 10 * p["step_wall_us"] / 1e6 * p["watcher_cpu_us_per_poll"] / 1e6
    assert h["cost"] == pytest.approx(extra / step_cpu)
    assert h["wall_cost"] == pytest.approx(extra / (p["step_wall_us"] / 1e6))
    assert h["target_cost"] == 0.02 and h["within_target"] == (h["cost"] <= 0.02)
    assert f"per step: {100 * h['cost']:+.2f} % of its" in proc.stdout


# --- peers: whole commands ------------------------------------------------------------

def test_run_command_reports_the_peak_memory_of_the_largest_process_of_the_command():
    """The child allocates 300 MiB in a grandchild: wait4's ru_maxrss sees it."""
    from support import subprocess_env
    from distkit.bench.peers import run_command

    code = ("import subprocess, sys; subprocess.run([sys.executable, '-c', "
            "'b = bytearray(300 * 2**20); b[::4096] = b\"x\" * len(b[::4096])'], check=True)")
    run = run_command([sys.executable, "-c", code], subprocess_env(), timeout_s=120)
    assert run["returncode"] == 0, run["stderr_tail"]
    assert 300 <= run["peak_rss_mib"] < 1000, run
    assert run["wall_s"] > 0


# A contender as fast as Python starts: writes its record, then aborts (SIGABRT) at exit
# always, on its first attempt of each round only, or never.
FAKE_CONTENDER = """import json, os, sys
out, mode, tries = sys.argv[1], sys.argv[2], sys.argv[3]
with open(out, "w") as f:
    json.dump({"epoch_times_s": [1.0, 0.5], "samples_per_epoch": 100, "final_val_accuracy": 0.5,
               "first_step_unix_s": None}, f)
with open(tries, "a") as f:
    f.write("x")
if mode == "always" or (mode == "first" and os.path.getsize(tries) % 2 == 1):
    print("terminate called without an active exception", file=sys.stderr)
    os.abort()
"""


def test_a_contender_that_aborts_is_retried_then_recorded_and_the_benchmark_goes_on(tmp_path):
    """Issue 22: a contender that dies of SIGABRT at exit ended the whole benchmark. Now
    the run is tried again; a round with no good attempt is recorded as failed and left
    out of that contender's medians and ratios; the others are measured as usual."""
    from distkit.bench import peers
    from distkit.bench.report import _peers_lines

    def fake(mode):
        tries = tmp_path / f"{mode}.tries"
        return (lambda d, port: [sys.executable, "-c", FAKE_CONTENDER, f"{d}/rank0.json", mode, str(tries)],
                peers._read_record, {})

    logged = []
    out = peers.compare_commands(16, 2, rounds=2, warmup=1, names=(), log=logged.append,
                                 extra={peers.BASELINE: fake("never"), "aborts": fake("always"),
                                        "aborts once": fake("first")})
    c = out["contenders"]
    always, once, base = c["aborts"], c["aborts once"], c[peers.BASELINE]
    assert always["failed_rounds"] == [1, 2] and always["samples_per_s"] == [None, None]
    assert always["throughput_ratio"] is None and always["rounds_counted"] == 0
    assert len(always["failures"]) == 6  # 2 attempts in each of 3 rounds (1 of them warm-up)
    assert {f["exit"] for f in always["failures"]} == {"killed by SIGABRT"}
    assert always["failures"][0]["warm_up"] and not always["failures"][-1]["warm_up"]
    assert "terminate called without an active exception" in always["failures"][0]["stderr_last_lines"]
    # retried: the second attempt of each round succeeded and counts
    assert once["failed_rounds"] == [] and once["attempts"] == [2, 2] and len(once["failures"]) == 3
    assert once["samples_per_s"] == [200.0, 200.0] and once["throughput_ratio"] == 1.0
    assert base["failures"] == [] and base["median"]["samples_per_s"] == 200.0
    assert any("aborts: round 2, attempt 1 failed (killed by SIGABRT)" in line for line in logged)
    text = "\n".join(_peers_lines({"default_batch": out, "load_average": {"start": 1, "end": 1}}))
    assert "aborts: rounds [1, 2] failed on every attempt: left out of its medians and ratios" in text
    assert "aborts once failed in round 1 (warm-up), attempt 1: killed by SIGABRT" in text


def test_peers_lists_every_contender_and_says_why_one_is_skipped(monkeypatch):
    from distkit.bench import peers

    monkeypatch.setattr(peers, "peers_python", lambda: None)
    table = peers.contenders(64, 1)
    assert set(table) == {"distkit", "distkit (torchrun)", peers.BASELINE, "ignite (idist.Parallel)",
                          "accelerate", "lightning fabric"}
    assert table["accelerate"].startswith("not installed: pip install accelerate lightning")
    argv = table["distkit"][0]("/tmp/x", 1234)
    assert argv[1:4] == ["-m", "distkit", "train"] and "--batch-size" in argv


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_bench_peers_tiny_runs_real_commands_and_pairs_the_ratios(tmp_path):
    """``distkit bench --tiny --only peers --check``: the kit's command and the
    hand-written torchrun loop (and, for tiny steps, the kit under torchrun) really run;
    every number comes from their records."""
    from support import subprocess_env

    proc = subprocess.run([sys.executable, "-m", "distkit", "bench", "--tiny", "--only", "peers",
                           "--check", "--output", str(tmp_path)], cwd=tmp_path, env=subprocess_env(),
                          capture_output=True, text=True, timeout=880)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "bench-tiny.json") as f:
        p = json.load(f)["peers"]
    assert "6 peers: whole commands, global batch 64" in proc.stdout
    default, tiny = p["default_batch"], p["tiny_steps"]
    assert set(default["contenders"]) == {"distkit", "hand-written (torchrun)"}
    assert set(tiny["contenders"]) == {"distkit", "distkit (torchrun)"}
    for name, c in default["contenders"].items():
        assert c["final_val_accuracy"][0] > 0.2  # it trained: 10 classes, chance is 0.1
        assert 0 < c["first_step_s"][0] < c["wall_s"][0]
        assert c["peak_rss_mib"][0] > 100  # a process that imported torch
    hand, kit = default["contenders"]["hand-written (torchrun)"], default["contenders"]["distkit"]
    assert kit["throughput_ratio"] == pytest.approx(kit["samples_per_s"][0] / hand["samples_per_s"][0])
    assert kit["wall_delta_s"] == pytest.approx(kit["wall_s"][0] - hand["wall_s"][0])
    own, torchrun = (tiny["contenders"][k]["samples_per_s"][0] for k in ("distkit", "distkit (torchrun)"))
    assert tiny["default_launch_vs_torchrun"] == pytest.approx(own / torchrun)
    assert tiny["per_process_batch"] == 8


def test_progress_bar_filter_lets_through_at_most_one_redraw_per_interval_and_every_epoch_end():
    """``at_most_every`` (the filter ``distkit train`` puts on its progress bar): few
    redraws, and always the epoch's last step, so the bar ends at its total."""
    import time

    from ignite.engine import Engine, Events

    from distkit.train.training import at_most_every

    engine = Engine(lambda e, b: time.sleep(0.001))
    seen = []
    engine.add_event_handler(Events.ITERATION_COMPLETED(event_filter=at_most_every(0.05)),
                             lambda e: seen.append(e.state.iteration))
    start = time.perf_counter()
    engine.run(range(100), max_epochs=2)
    elapsed = time.perf_counter() - start
    assert seen[0] == 1 and 100 in seen and seen[-1] == 200
    assert len(seen) <= elapsed / 0.05 + 3  # one per interval, plus the two epoch ends
    assert len(seen) < 200


@pytest.mark.skipif(sys.platform != "linux", reason="fork is used on Linux only")
def test_the_launcher_forks_gloo_workers_at_any_thread_count():
    """Forked workers start seconds sooner (benchmarks/results/start-method.txt), and
    forking at every thread count makes the same code behave the same on any machine
    (tests/launch/test_start_method.py: several threads per forked worker, made safe)."""
    from distkit.launch.entry import _fork_is_safe

    assert _fork_is_safe(Config(backend="gloo", nproc_per_node=2, threads_per_process=1))
    assert _fork_is_safe(Config(backend="gloo", nproc_per_node=2, threads_per_process=2))
    assert not _fork_is_safe(Config(backend="nccl", nproc_per_node=2, threads_per_process=1))
