"""Plausible wrong answers to exercise 14 (the FLOPs of a step and its MFU), in the format
of ``WRONG_ANSWERS`` in test_exercises.py, which grades them with the others: (exercise,
what the learner did, the change to the solution, what the learner must read)."""

WRONG_ANSWERS_14 = [
    ("14", "forward only (2N)",
     [("weights = 6 * n", "weights = 2 * n"), ("attention = 3 * L *", "attention = 1 * L *")],
     r"you counted the forward pass only .*count the backward too"),
    ("14", "attention forgotten",
     [("return (weights + attention) * tokens", "return weights * tokens")],
     r"you left out attention's own products, Q K\^T and A V"),
    ("14", "one process's tokens, not the run's",
     [("tokens = batch_per_rank * world_size * T", "tokens = batch_per_rank * T")],
     r"that is ONE process's step: all 2 processes train batch_per_rank sequences each"),
    ("14", "milliseconds taken for seconds",
     [("achieved = flops_per_step / (step_time_ms / 1000.0)", "achieved = flops_per_step / step_time_ms")],
     r"1000x too small: step_time_ms is in MILLIseconds"),
    ("14", "the embedding tables counted",
     [('\n            if not name.startswith(("tok_emb.", "pos_emb.")))', ")")],
     r"you counted the embedding tables \(tok_emb, pos_emb\) in N"),
    ("14", "a percentage",
     [("return achieved / peak_flops", "return 100 * achieved / peak_flops")],
     r"that is a percentage; return the fraction"),
    ("14", "the causal half of attention",
     [("attention = 3 * L * (2 * T * d + 2 * T * d)", "attention = 3 * L * (T * d + T * d)")],
     r"you counted half of attention's products"),
    # an extra or missing term: far below the old 2.5% tolerance, caught by the exact count
    ("14", "the biases and LayerNorm weights left out of N",
     [('\n            if not name.startswith(("tok_emb.", "pos_emb.")))',
       '\n            if not name.startswith(("tok_emb.", "pos_emb.")) and p.dim() == 2)')],
     r"the reference count is \d+ \(per token of the step's \d+ tokens yours is -\d+ FLOPs off the reference's "
     r"count \(here L = \d+, T = \d+, d = \d+\); a whole number of parameters' worth: check which parameters N "
     r"counts \(\d+ of this model's take part in matrix products\)\).*DISTKIT_CHECK_SEED=\d+ replays"),
    ("14", "attention's backward counted once, not twice",
     [("attention = 3 * L *", "attention = 2 * L *")],
     r"step_flops gave \d+ FLOPs .* the reference count is \d+ \(per token of the step's \d+ tokens yours is -\d+ "
     r"FLOPs off"),
    ("14", "a tensor returned", [("    return (weights + attention) * tokens",
                                  "    import torch\n    return torch.tensor((weights + attention) * tokens)")],
     r"step_flops returned a int64 tensor of shape \(\) for the GPT .*: return a number"),
    ("14", "the MFU as a formatted string", [("    return achieved / peak_flops", '    return f"{achieved / peak_flops:.1%}"')],
     r"mfu\(6e\+12 FLOPs a step, a step every 500 ms, peak 2e\+13 FLOP/s\) returned '60\.0%': return a number"),
    ("14", "the MFU with integer division", [("    return achieved / peak_flops", "    return achieved // peak_flops")],
     r"returned 0, not 0\.6: the FLOPs of a step divided by its time in seconds is the achieved FLOP/s"),
]
