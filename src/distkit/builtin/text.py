"""The built-in text task's parts (``--dataset text --model gpt``): its loss, metrics,
optimizer and the line of text it samples at the end. :mod:`distkit.tasks` assembles them
into a :class:`~distkit.tasks.Task`; the data is :func:`distkit.builtin.data.text_datasets`, the
model :class:`distkit.builtin.models.GPT`. Nothing here knows about ranks.

A GPT predicts a token at every position: logits ``(B, T, V)`` against targets
``(B, T)``. The loss and the accuracy flatten both to ``(B*T, V)`` and ``(B*T,)``, so
they are means over every predicted character.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class TokenCrossEntropy(nn.Module):
    """Cross entropy over every position: ``(B, T, V)`` logits, ``(B, T)`` targets."""

    def forward(self, logits, targets):
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def flatten_tokens(output):
    """An ignite ``output_transform``: ``(y_pred (B, T, V), y (B, T))`` to
    ``((B*T, V), (B*T,))``, so classification metrics count characters."""
    y_pred, y = output[0], output[1]
    return y_pred.flatten(0, 1), y.flatten()


def token_metrics() -> dict:
    """Next-character accuracy (the task's loss is added by the kit as ``loss``)."""
    from ignite.metrics import Accuracy

    return {"accuracy": Accuracy(output_transform=flatten_tokens)}


def adamw(params, config):
    """AdamW at ``config.lr`` (the kit's schedule then drives it), betas (0.9, 0.99) as
    small character models use, ``config.weight_decay``."""
    return torch.optim.AdamW(params, lr=config.lr, betas=(0.9, 0.99),
                             weight_decay=config.weight_decay)


def sample_text(model, vocab, prompt: str = "\n", max_chars: int = 80, temperature: float = 0.8,
                seed: int = 0, one_line: bool = True) -> str:
    """Characters the model writes after ``prompt`` (up to ``max_chars``; with
    ``one_line`` up to the first newline). The same seed draws the same text, so every
    rank of a run writes the same line (under fsdp every rank must call it: its forward
    all-gathers the weights)."""
    raw = getattr(model, "module", model)  # DDP keeps the user's model in .module
    was_training = raw.training
    raw.eval()
    device = next(raw.parameters()).device
    g = torch.Generator().manual_seed(seed)
    idx = vocab.encode(prompt).unsqueeze(0).to(device)
    out = []
    for _ in range(max_chars):
        idx = raw.generate(idx, 1, temperature=temperature, generator=g)
        ch = vocab.decode(idx[0, -1:])
        if one_line and ch == "\n":
            if out:
                break
            continue
        out.append(ch)
    raw.train(was_training)
    return "".join(out)


def text_summary(model, config) -> dict:
    """What the text task adds to a run's results: one sampled line."""
    from distkit.builtin.data import text_vocab

    return {"sample": sample_text(model, text_vocab(), seed=config.seed)}
