"""The scaling study: its plan, its arithmetic, and one small real study (world sizes 1
and 2, gloo) whose numbers must be consistent with what was asked for."""
from __future__ import annotations

import math

import pytest

from distkit.lessons import scaling
from distkit.config import Config
from distkit.errors import DistkitError
from distkit.builtin.models import get_model


def test_plan_runs_each_configuration_once_even_if_it_serves_two_curves():
    jobs = scaling.plan((1, 2, 4), strong_batch=64, weak_batch=16)
    keys = [(j.world_size, j.per_process_batch, j.scale_lr) for j in jobs]
    assert len(keys) == len(set(keys)) == 7
    by_key = {(j.world_size, j.per_process_batch, j.scale_lr): j.labels for j in jobs}
    # 4 processes x 16 = the strong batch 64: one run is both strong and weak (same lr)
    assert set(by_key[(4, 16, False)]) == {(scaling.STRONG, scaling.PLAIN), (scaling.WEAK, scaling.PLAIN)}
    assert by_key[(2, 32, False)] == ((scaling.STRONG, scaling.PLAIN),)
    assert by_key[(2, 16, True)] == ((scaling.WEAK, scaling.SCALED),)
    assert not any(j.scale_lr for j in jobs if j.world_size == 1)  # N = 1: the baseline...
    assert set(by_key[(1, 16, False)]) == {(scaling.WEAK, scaling.PLAIN), (scaling.WEAK, scaling.SCALED)}


def test_plan_refuses_a_strong_batch_a_world_size_does_not_divide():
    with pytest.raises(DistkitError, match="does not divide by world size 3"):
        scaling.plan((1, 3), strong_batch=64)


def test_job_config_sets_batch_lr_rule_and_pinned_threads():
    job = scaling.Job(4, 16, True, ((scaling.WEAK, scaling.SCALED),))
    cfg = scaling.job_config(Config(lr=0.1), job, warmup_epochs=1.0, threads=1)
    assert (cfg.batch_size, cfg.scale_lr, cfg.warmup_epochs, cfg.threads_per_process) == (64, True, 1.0, 1)
    plain = scaling.job_config(Config(lr=0.1), scaling.Job(4, 16, False), warmup_epochs=1.0)
    assert (plain.scale_lr, plain.warmup_epochs) == (False, 0.0)


def run_row(n, times, samples, labels, loss=0.5):
    return {"world_size": n, "per_process_batch": 8, "global_batch": 8 * n, "peak_lr": 0.1,
            "threads_per_process": 1, "labels": labels, "epoch_times_s": times,
            "samples_per_epoch": samples, "epochs_completed": len(times), "final_val_loss": loss,
            "final_val_accuracy": 0.9}


def test_summary_medians_efficiency_and_first_epoch_left_out():
    strong = [[scaling.STRONG, scaling.PLAIN]]
    runs = [run_row(1, [9.0, 2.0, 2.0], 1000, strong), run_row(1, [9.0, 2.2, 2.2], 1000, strong),
            run_row(1, [9.0, 1.8, 1.8], 1000, strong),
            run_row(2, [5.0, 1.25, 1.25], 1000, strong), run_row(2, [5.0, 1.25, 1.25], 1000, strong)]
    (one, two) = scaling.summarize(runs)
    assert one["epoch_time_s"] == 2.0  # median of the repeats' steady epochs, not 9 s
    assert one["samples_per_s"] == 500 and one["efficiency"] == 1.0
    assert two["samples_per_s"] == 800 and two["speedup"] == pytest.approx(1.6)
    assert two["efficiency"] == pytest.approx(0.8)  # 800 / (2 x 500)
    assert scaling.efficiency(800, 2, 500) == pytest.approx(0.8)
    assert "0.80" in scaling.format_table([one, two])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_small_study_measures_what_it_claims(tmp_path):
    base = Config(dataset="synthetic", dataset_size=256, epochs=3, lr=0.05, output_dir=str(tmp_path),
                  early_stopping_patience=1, early_stopping_min_delta=100.0)  # stop after epoch 2
    study = scaling.scaling_study(base, world_sizes=(1, 2), strong_batch=32, weak_batch=16,
                                  repeats=1, cost_repeats=3)
    summary = {(r["mode"], r["lr_rule"], r["world_size"]): r for r in study["summary"]}
    assert set(summary) == {("strong", scaling.PLAIN, 1), ("strong", scaling.PLAIN, 2),
                            ("weak", scaling.PLAIN, 1), ("weak", scaling.PLAIN, 2),
                            ("weak", scaling.SCALED, 1), ("weak", scaling.SCALED, 2)}
    assert summary[("weak", scaling.SCALED, 1)] == {**summary[("weak", scaling.PLAIN, 1)],
                                                     "lr_rule": scaling.SCALED}  # one run
    assert summary[("weak", scaling.SCALED, 2)]["peak_lr"] == pytest.approx(0.1)  # lr x 2
    assert summary[("strong", scaling.PLAIN, 2)]["peak_lr"] == pytest.approx(0.05)
    assert summary[("strong", scaling.PLAIN, 2)]["global_batch"] == 32
    assert summary[("weak", scaling.PLAIN, 2)]["global_batch"] == 32
    for row in study["summary"]:
        assert row["epochs_completed"] == 2, "EarlyStopping(patience=1) stops after epoch 2"
        assert row["threads_per_process"] == 1 and row["samples_per_s"] > 0
        assert math.isfinite(row["final_val_loss"])
    assert summary[("strong", scaling.PLAIN, 1)]["efficiency"] == 1.0
    # bytes all-reduced per step: the model's gradients with 2 processes, nothing with 1
    cnn_bytes = sum(p.numel() * 4 for p in get_model("cnn").parameters())
    costs = {(c["world_size"], c["per_process_batch"]): c for c in study["costs"]}
    assert set(costs) == {(1, 32), (1, 16), (2, 16)}
    assert costs[(2, 16)]["bytes_allreduced_per_step"] == cnn_bytes
    assert costs[(1, 16)]["bytes_allreduced_per_step"] == 0
    assert costs[(2, 16)]["bytes_sent_per_process"] == cnn_bytes  # 2 (N-1)/N = 1 for N = 2
    assert all(c["compute_s"] > 0 and c["step_s"] > 0 for c in study["costs"])
    assert costs[(2, 16)]["allreduce_s"] > 0 and costs[(1, 16)]["allreduce_s"] == 0
    assert study["machine"]["threads_per_process"] == 1
