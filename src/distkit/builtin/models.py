"""Plain ``nn.Module`` models. Nothing here knows about processes or ranks.

Image classifiers (``cnn``, ``mlp``, ``resnet18``) and a character-level :class:`GPT`
(``gpt``) whose :class:`Block` the tensor, context and pipeline notebooks split."""
from __future__ import annotations

import torch.nn as nn


class SmallCNN(nn.Module):
    """Two 3x3 convolutions, a pooling step and a two-layer head."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 8):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(64 * (image_size // 2) ** 2, 128), nn.ReLU(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x):
        return self.head(self.features(x))


class MLP(nn.Module):
    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 8,
                 hidden: int = 128):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(in_channels * image_size ** 2, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        return self.net(x)


def cifar_resnet18(in_channels: int = 3, num_classes: int = 10, image_size: int = 32):
    """torchvision's ResNet-18 with the CIFAR stem: a 3x3 stride-1 first convolution and
    no max-pool, so 32x32 images are not shrunk to 8x8 before the first block."""
    from torchvision.models import resnet18

    model = resnet18(num_classes=num_classes)
    model.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def get_model(name: str, in_channels: int = 1, num_classes: int = 10, image_size: int = 8,
              **sizes):
    """The model ``name`` for a dataset's shape (:func:`distkit.builtin.data.dataset_info`). The
    image models take ``in_channels``, ``num_classes``, ``image_size``; ``gpt`` takes
    ``vocab_size`` and ``block_size``."""
    if name == "gpt":
        return gpt(**sizes)
    builders = {"cnn": SmallCNN, "mlp": MLP, "resnet18": cifar_resnet18}
    return builders[name](in_channels=in_channels, num_classes=num_classes, image_size=image_size)


# --- a character-level GPT ------------------------------------------------------------
#
# Every linear layer is a named submodule, so ``parallelize_module`` plans can address it
# by its path: ``blocks.0.attn.q`` ... ``blocks.0.mlp.proj``. The attention reshapes with
# ``head_dim`` (not the number of heads), so after a column split of q/k/v each rank works
# on its own heads unchanged. The blocks live in a ``ModuleDict`` and every stage of the
# forward skips a part that is ``None``: a pipeline stage is this model with the other
# stages' parts deleted (the pattern of torch's pipelining tutorial).

class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: ``q``, ``k``, ``v`` then ``proj``."""

    def __init__(self, d_model: int, n_head: int, bias: bool = True):
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model {d_model} must divide by n_head {n_head}")
        self.head_dim = d_model // n_head
        self.q = nn.Linear(d_model, d_model, bias=bias)
        self.k = nn.Linear(d_model, d_model, bias=bias)
        self.v = nn.Linear(d_model, d_model, bias=bias)
        self.proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x):
        import torch.nn.functional as F

        B, T, _ = x.shape

        def heads(t):  # (B, T, H*hd) -> (B, H, T, hd); H = the heads this module holds
            return t.view(B, T, -1, self.head_dim).transpose(1, 2)

        y = F.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)),
                                           is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    """``fc`` (d -> 4d), GELU, ``proj`` (4d -> d)."""

    def __init__(self, d_model: int, hidden: int, bias: bool = True):
        super().__init__()
        self.fc = nn.Linear(d_model, hidden, bias=bias)
        self.act = nn.GELU()
        self.proj = nn.Linear(hidden, d_model, bias=bias)

    def forward(self, x):
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    """A pre-norm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, d_model: int = 128, n_head: int = 4, mlp_ratio: int = 4):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = FeedForward(d_model, mlp_ratio * d_model)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A character-level GPT: token and position embeddings, ``n_layer`` blocks, a final
    LayerNorm and a linear head to ``vocab_size`` logits. ``forward(idx)`` maps token ids
    ``(B, T)`` (``T <= block_size``) to logits ``(B, T, vocab_size)``::

        >>> import torch
        >>> model = GPT(vocab_size=103)
        >>> model(torch.zeros(2, 16, dtype=torch.long)).shape
        torch.Size([2, 16, 103])
        >>> sorted(dict(model.named_modules()))[:4]
        ['', 'blocks', 'blocks.0', 'blocks.0.attn']
    """

    def __init__(self, vocab_size: int, block_size: int = 128, n_layer: int = 4,
                 n_head: int = 4, d_model: int = 128):
        super().__init__()
        self.vocab_size, self.block_size = vocab_size, block_size
        self.n_layer, self.n_head, self.d_model = n_layer, n_head, d_model
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(block_size, d_model)
        self.blocks = nn.ModuleDict({str(i): Block(d_model, n_head) for i in range(n_layer)})
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.apply(_gpt_init)

    def forward(self, idx):
        import torch

        h = idx
        if self.tok_emb is not None:  # None in a later pipeline stage: h is the activation
            pos = torch.arange(idx.shape[1], device=idx.device)
            h = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks.values():
            h = block(h)
        if self.ln_f is not None:
            h = self.ln_f(h)
        return self.head(h) if self.head is not None else h

    def matmul_params(self) -> int:
        """Parameters that take part in matrix products: all but the embedding tables (a
        lookup does no arithmetic)."""
        tables = {id(p) for m in (self.tok_emb, self.pos_emb) if m is not None for p in m.parameters()}
        return sum(p.numel() for p in self.parameters() if id(p) not in tables)

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (forward + backward): the weights' matrix products and
        attention's two (``QK^T`` and ``AV``), counted as the PaLM paper's appendix B and
        nanoGPT count them, causal masking's skipped half included. How the count is made
        is exercise 14's question (exercises/14_flops_mfu.py)."""
        T = seq_len or self.block_size
        return 6.0 * self.matmul_params() + 12.0 * len(self.blocks) * T * self.d_model

    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, generator=None):
        """Extend ``idx`` ``(B, T0)`` by ``max_new_tokens`` sampled tokens (the context is
        cut to the last ``block_size``); ``generator`` makes the draw reproducible."""
        import torch

        for _ in range(max_new_tokens):
            with torch.no_grad():
                logits = self(idx[:, -self.block_size:])[:, -1, :] / temperature
            probs = torch.softmax(logits.float(), dim=-1)
            nxt = torch.multinomial(probs.cpu(), 1, generator=generator).to(idx.device)
            idx = torch.cat([idx, nxt], dim=1)
        return idx


def _gpt_init(module):
    # GPT-2's initialisation: small normal weights, zero biases.
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


GPT_SIZES = {
    # the kit's default: a pass over the text in about a minute on 2 CPU cores
    "default": {"n_layer": 4, "n_head": 4, "d_model": 128, "block_size": 128},
    # GPT-2 small's shape (12 layers, 12 heads, d_model 768, context 1024) with the kit's
    # character vocabulary, so about 85 M parameters (GPT-2's 124 M count its 50,257-token
    # embedding): the size at which MFU on a GPU means something
    "gpt2-small": {"n_layer": 12, "n_head": 12, "d_model": 768, "block_size": 1024},
}
"""The GPT's sizes by name: ``distkit train --dataset text --model gpt --set size=NAME``."""


def gpt_size(name: str) -> dict:
    """The sizes of :data:`GPT_SIZES` ``name``; an unknown name fails in one line."""
    if name not in GPT_SIZES:
        from distkit.errors import DistkitError

        raise DistkitError(f"--set size={name}: the GPT comes in sizes {', '.join(GPT_SIZES)}: "
                           f"pick one of them")
    return dict(GPT_SIZES[name])


def gpt(vocab_size: int, block_size: int = 128, **sizes) -> GPT:
    """The kit's default GPT: 4 layers, 4 heads, d_model 128 (about 0.8 M parameters)."""
    return GPT(vocab_size, block_size, **sizes)
