"""A run stopped at iteration k and resumed from its checkpoint ends with bit-identical
parameters to an uninterrupted run (2 gloo processes, CPU)."""
from __future__ import annotations

import pytest
import torch

from distkit.launch import run


def final_weights(results):
    ckpt = torch.load(results["last_checkpoint"], map_location="cpu", weights_only=True)
    return ckpt["model"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_interrupted_and_resumed_equals_uninterrupted(fast_config):
    epochs, stop_at = 3, 30  # 23 iterations per epoch: stop in the middle of epoch 2
    whole = run(fast_config(nproc_per_node=2, epochs=epochs))
    first = run(fast_config(nproc_per_node=2, epochs=epochs, max_iters=stop_at))
    assert first["iterations"] == stop_at
    assert first["last_checkpoint"].endswith(f"_{stop_at}.pt")
    resumed = run(fast_config(nproc_per_node=2, epochs=epochs, resume_from=first["last_checkpoint"]))

    assert resumed["iterations"] == whole["iterations"] == 23 * epochs
    assert resumed["run_dir"] != first["run_dir"], "a resumed run writes a fresh folder"
    a, b = final_weights(whole), final_weights(resumed)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after resume"
    # And the check can fail: the interrupted run's weights are not the final ones.
    c = final_weights(first)
    assert any(not torch.equal(a[n], c[n]) for n in a)
