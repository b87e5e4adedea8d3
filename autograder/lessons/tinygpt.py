"""The capstone's small GPT (assignment 06): a Llama-shaped decoder small enough for 8 CPU ranks.

    from autograder.lessons.tinygpt import ModelArgs, TinyGPT, master_state
    model = TinyGPT(ModelArgs()).double()
    model.load_state_dict(master_state(ModelArgs(), seed=0))

Module names follow torchtitan's Llama (`torchtitan/models/llama3/model.py` before
the 2026 refactor): `tok_embeddings`, `layers["0"]`, `attention.wq/wk/wv/wo`,
`feed_forward.w1/w2/w3`, `attention_norm`, `ffn_norm`, `norm`, `output`, so a
torchtitan-style tensor-parallel plan applies as is. Activations are `[b, s, h]`
(PyTorch's and torchtitan's layout: the sequence is dim 1, `Shard(1)` under
sequence parallelism). Separate q, k, v projections (a fused qkv weight under
`ColwiseParallel` would hand each rank a slice of q *and* k, silently wrong);
no position embedding (a learned one would need its own sequence-parallel
treatment; the causal mask alone tells positions apart); the output head is
tied to the embedding. Attention is written with plain matmuls so that it runs
in float64 on the CPU and on any number of local heads: `view(b, s, -1, head_dim)`
infers the number of heads a tensor-parallel rank holds.

A pipeline stage is the same class with some parts set to `None`
(`tok_embeddings` off the first stage, `norm` and `output` off the last, the
other stages' layers deleted from the `ModuleDict`, so names stay global):
`forward` then takes and returns hidden states `[b, s, h]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["ModelArgs", "TinyGPT", "master_state"]


@dataclass(frozen=True)
class ModelArgs:
    """Sizes of the small GPT. Every size a tensor-parallel group splits must divide by its size."""

    vocab_size: int = 16
    dim: int = 8
    n_heads: int = 2
    ffn_dim: int = 16
    n_layers: int = 2
    norm_eps: float = 1e-6


class Attention(nn.Module):
    """Causal multi-head self-attention with separate q, k, v projections; `[b, s, h] -> [b, s, h]`."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.dim, bias=False)
        self.wk = nn.Linear(args.dim, args.dim, bias=False)
        self.wv = nn.Linear(args.dim, args.dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # [b, s, heads * head_dim] -> [b, heads, s, head_dim]; `-1`: the heads this rank holds
        q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)  # [b, heads, s, s]
        future = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        out = scores.softmax(dim=-1) @ v  # [b, heads, s, head_dim]
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))  # [b, s, h]


class FeedForward(nn.Module):
    """SwiGLU MLP, as Llama: `w2(silu(w1 x) * w3 x)`."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.ffn_dim, bias=False)
        self.w2 = nn.Linear(args.ffn_dim, args.dim, bias=False)
        self.w3 = nn.Linear(args.dim, args.ffn_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm block: `h = x + attention(norm(x))`, `out = h + feed_forward(norm(h))`."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.feed_forward = FeedForward(args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class TinyGPT(nn.Module):
    """Embedding, `n_layers` blocks, final norm, output head tied to the embedding.

    `forward(tokens [b, s] int64) -> logits [b, s, vocab]`; a stage without
    `tok_embeddings` takes hidden states `[b, s, h]`, one without `output`
    returns them.
    """

    def __init__(self, args: ModelArgs = ModelArgs()):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(args) for i in range(args.n_layers)})
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.output.weight = self.tok_embeddings.weight  # tied: one Parameter, two uses

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def master_state(args: ModelArgs = ModelArgs(), *, seed: int = 0, dtype=torch.float64) -> dict:
    """A full ("master") state dict from a seed, the same in every process that asks for it.

    Weights are drawn from N(0, 0.5^2) and norm scales from 1 + N(0, 0.1^2), so that
    every gradient, the norm scales' included, is far from zero.
    """
    gen = torch.Generator().manual_seed(seed)
    model = TinyGPT(args)
    state = {}
    for name, p in model.state_dict().items():
        if name.endswith("norm.weight"):
            value = 1.0 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
        else:
            value = 0.5 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
        state[name] = value.to(dtype)
    state["output.weight"] = state["tok_embeddings.weight"]  # the tie, also in the state dict
    return state
