"""A headline classifier written the way a course writes one, not in the kit's style:
dict samples of any length padded per batch by its own collate_fn, a small Transformer
encoder, its own train_step (2 micro-batches accumulated, gradients clipped), AdamW with a
bare OneCycleLR built from epoch_length, its own macro-F1 Metric, early stopping on it.
distkit's tests train it unchanged with `distkit train --task` (spawn, torchrun) and
assert that what it asked for happened (tests/tasks/test_foreign_code.py)."""
import contextlib

import ignite.distributed as idist
import torch
import torch.nn as nn
from ignite.engine import Events
from ignite.exceptions import NotComputableError
from ignite.handlers import EarlyStopping
from ignite.metrics import Metric
from ignite.metrics.metric import reinit__is_reduced, sync_all_reduce
from torch.utils.data import Dataset

from distkit import Task

VOCAB, CLASSES, PAD = 48, 3, 0
MAX_LR = 3e-3


class Headlines(Dataset):
    """{"tokens": 4 to 14 word ids, "label": 0, 1 or 2}: a headline of class c draws most
    of its words from the c-th third of the vocabulary."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        band = (VOCAB - 1) // CLASSES
        for i in range(n):
            label = i % CLASSES
            length = int(torch.randint(4, 15, (1,), generator=g))
            topical = 1 + label * band + torch.randint(0, band, (length,), generator=g)
            noise = torch.randint(1, VOCAB, (length,), generator=g)
            tokens = torch.where(torch.rand(length, generator=g) < 0.5, topical, noise)
            self.items.append({"tokens": tokens, "label": label})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def make_datasets(config):
    sizes = config.task_settings
    return Headlines(sizes["train_size"], config.seed), Headlines(sizes["val_size"], config.seed + 1)


def pad_collate(samples):
    """Padded to the longest headline of this batch, with its attention mask."""
    longest = max(len(s["tokens"]) for s in samples)
    ids = torch.full((len(samples), longest), PAD, dtype=torch.long)
    for row, s in enumerate(samples):
        ids[row, :len(s["tokens"])] = s["tokens"]
    return {"input_ids": ids, "attention_mask": ids != PAD,
            "labels": torch.tensor([s["label"] for s in samples])}


def prepare_batch(batch, device, non_blocking):
    x = {k: batch[k].to(device, non_blocking=non_blocking) for k in ("input_ids", "attention_mask")}
    return x, batch["labels"].to(device, non_blocking=non_blocking)


class HeadlineEncoder(nn.Module):
    def __init__(self, dim=32):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim, padding_idx=PAD)
        self.position = nn.Embedding(16, dim)
        layer = nn.TransformerEncoderLayer(dim, nhead=2, dim_feedforward=64, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, x):
        ids, mask = x["input_ids"], x["attention_mask"]
        h = self.embed(ids) + self.position(torch.arange(ids.shape[1], device=ids.device))
        h = self.encoder(h, src_key_padding_mask=~mask)
        pooled = (h * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
        return self.head(pooled)


def make_model(config):
    return HeadlineEncoder()


def adamw(params, config):
    return torch.optim.AdamW(params, lr=MAX_LR, weight_decay=0.01)


def one_cycle(optimizer, config, epoch_length):
    # as courses write it: one step per batch, so total steps = epochs x batches per epoch
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=MAX_LR, epochs=config.epochs,
                                               steps_per_epoch=epoch_length, pct_start=0.25)


def make_step(model, optimizer, loss_fn, config):
    """2 micro-batches per optimizer step, gradients clipped to norm 1."""
    micro = config.task_settings["micro_batches"]

    def update(engine, batch):
        model.train()
        x, y = prepare_batch(batch, idist.device(), True)
        chunks = list(zip(*(torch.chunk(t, micro) for t in (x["input_ids"], x["attention_mask"], y))))
        total = 0.0
        for i, (ids, mask, labels) in enumerate(chunks):
            last = i == len(chunks) - 1
            sync = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
            with sync:
                logits = model({"input_ids": ids, "attention_mask": mask})
                loss = loss_fn(logits, labels) * len(labels) / len(y)
                loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return {"loss": total, "batch_size": len(y), "logits_dtype": str(logits.dtype)}

    return update


class MacroF1(Metric):
    """Macro-averaged F1 over the classes, counts summed over every rank."""

    @reinit__is_reduced
    def reset(self):
        self._tp = torch.zeros(CLASSES, dtype=torch.float64)
        self._fp = torch.zeros(CLASSES, dtype=torch.float64)
        self._fn = torch.zeros(CLASSES, dtype=torch.float64)
        self._seen = 0

    @reinit__is_reduced
    def update(self, output):
        y_pred, y = output[0].detach().argmax(1).cpu(), output[1].detach().cpu()
        for c in range(CLASSES):
            self._tp[c] += ((y_pred == c) & (y == c)).sum()
            self._fp[c] += ((y_pred == c) & (y != c)).sum()
            self._fn[c] += ((y_pred != c) & (y == c)).sum()
        self._seen += len(y)

    @sync_all_reduce("_tp", "_fp", "_fn", "_seen")
    def compute(self):
        if self._seen == 0:
            raise NotComputableError("MacroF1 needs at least one batch")
        f1 = 2 * self._tp / (2 * self._tp + self._fp + self._fn).clamp(min=1)
        return float(f1.mean())


def make_metrics():
    return {"f1": MacroF1()}


SEEN = {"logits_dtype": set()}


def attach(trainer, evaluator, config):
    def f1(engine):
        return engine.state.metrics["f1"]

    evaluator.add_event_handler(Events.COMPLETED, EarlyStopping(
        patience=config.task_settings["patience"], score_function=f1, trainer=trainer))

    @trainer.on(Events.ITERATION_COMPLETED)
    def precision(engine):
        SEEN["logits_dtype"].add(engine.state.output["logits_dtype"])


def summary(model, config):
    return {"logits_dtype": ",".join(sorted(SEEN["logits_dtype"]))}


task = Task(datasets=make_datasets, model=make_model, collate_fn=pad_collate,
            prepare_batch=prepare_batch, train_step=make_step, optimizer=adamw,
            lr_scheduler=one_cycle, metrics=make_metrics, score=("f1", "max"), handlers=attach,
            settings={"micro_batches": 2, "patience": 2, "train_size": 384, "val_size": 150}, summary=summary)
