"""``--strategy fsdp``: FSDP2's ``fully_shard`` instead of DDP, in the same training
function. It learns what ddp learns, its checkpoints resume bit-exactly and load into a
plain model, results.json reports peak memory per rank, and a backend without a
torch.distributed process group is refused in one line. Real gloo processes, CPU."""
from __future__ import annotations

import pytest
import torch

from distkit.launch.entry import run

ACCURACY_TOLERANCE = 0.02  # |fsdp - ddp| validation accuracy after the same 2 epochs


def weights(path):
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fsdp_learns_what_ddp_learns(fast_config):
    ddp = run(fast_config(nproc_per_node=2, strategy="ddp"))
    fsdp = run(fast_config(nproc_per_node=2, strategy="fsdp"))
    assert (ddp["strategy"], fsdp["strategy"]) == ("ddp", "fsdp")
    gap = abs(ddp["final"]["val_accuracy"] - fsdp["final"]["val_accuracy"])
    assert gap <= ACCURACY_TOLERANCE, f"fsdp {fsdp['final']} vs ddp {ddp['final']}"
    assert fsdp["final"]["val_accuracy"] > 0.3, "fsdp must learn, not merely match an untrained ddp"
    for r in (ddp, fsdp):
        memory = r["peak_memory_per_rank"]
        assert len(memory["bytes"]) == 2 and all(b > 0 for b in memory["bytes"]), memory
    # An fsdp checkpoint holds full, unsharded weights: a plain model loads it strictly.
    from distkit.tasks import resolve_task

    plain = resolve_task(fast_config()).model(fast_config())
    plain.load_state_dict(weights(fsdp["last_checkpoint"])["model"])


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_fsdp_interrupted_and_resumed_equals_uninterrupted(fast_config):
    epochs, stop_at = 2, 30  # 23 iterations per epoch: stop in the middle of epoch 2
    whole = run(fast_config(nproc_per_node=2, epochs=epochs, strategy="fsdp"))
    first = run(fast_config(nproc_per_node=2, epochs=epochs, strategy="fsdp", max_iters=stop_at))
    assert first["iterations"] == stop_at
    resumed = run(fast_config(nproc_per_node=2, epochs=epochs, strategy="fsdp",
                              resume_from=first["last_checkpoint"]))
    assert resumed["iterations"] == whole["iterations"] == 23 * epochs
    a, b = weights(whole["last_checkpoint"]), weights(resumed["last_checkpoint"])
    for part in ("model", "optimizer"):
        flat_a, flat_b = _tensors(a[part]), _tensors(b[part])
        assert flat_a.keys() == flat_b.keys() and flat_a, part
        for name in flat_a:
            assert torch.equal(flat_a[name], flat_b[name]), f"{part} {name} differs after resume"
    # The check can fail: the interrupted run's weights are not the final ones.
    c = weights(first["last_checkpoint"])["model"]
    assert any(not torch.equal(a["model"][n], c[n]) for n in c)
    assert whole["replica_param_sha256"]["final"] == resumed["replica_param_sha256"]["final"]


def _tensors(tree, prefix=""):
    """Every tensor of a nested state dict, by its path."""
    out = {}
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for k, v in items:
        if torch.is_tensor(v):
            out[f"{prefix}{k}"] = v
        else:
            out.update(_tensors(v, f"{prefix}{k}."))
    return out


@pytest.mark.parametrize("backend", ["none", "xla-tpu"])
def test_fsdp_without_a_process_group_is_refused_in_one_line(run_cli, backend):
    done = run_cli("train", "--strategy", "fsdp", "--backend", backend, timeout=60)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("distkit: error: --strategy fsdp needs a torch.distributed process group")
    assert f"--backend {backend}" in lines[0] and "--strategy ddp" in lines[0]
    assert "Traceback" not in done.stderr


def test_unknown_strategy_is_refused(run_cli):
    done = run_cli("train", "--strategy", "zero", timeout=60)
    assert done.returncode != 0 and "invalid choice: 'zero'" in done.stderr


def _fsdp_units(local_rank):
    from torch.distributed.fsdp import FSDPModule

    from distkit.builtin.models import GPT
    from distkit.train.strategies import prepare_model

    model = prepare_model(GPT(11, 8, n_layer=2, n_head=2, d_model=8), "fsdp")
    return sorted(name for name, m in model.named_modules() if isinstance(m, FSDPModule))


def test_fsdp_shards_a_model_with_blocks_one_block_per_unit():
    """The GPT's blocks are units whole (their eight layers gathered at once); the layers
    outside them, one unit each; the root drives the hooks."""
    from distkit.launch.runner import run_per_rank

    units = run_per_rank(_fsdp_units, 2, "gloo", start_method="fork")
    assert units[0] == units[1] == ["", "blocks.0", "blocks.1", "head", "ln_f", "pos_emb", "tok_emb"]
