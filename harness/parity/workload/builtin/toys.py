"""The four toy workloads of the embedded matrix, each chosen for a bug class.

* ``mlp``: a nested MLP whose layers are separate FSDP units (nested wrapping), the default.
* ``transformer``: a two-block causal transformer whose output head shares (ties) the embedding
  weight, so one parameter receives gradient from two places.
* ``frozen``: a frozen first layer (``requires_grad=False``) and a one-element ``gain`` parameter
  in an FSDP unit of its own, so sharding leaves every rank but rank 0 with an *empty* shard: the
  scaler must still join the found_inf agreement on a rank that holds no gradient elements.
* ``embedding``: ``nn.Embedding(sparse=True)`` with a fixed projection; batches repeat indices so a
  sparse gradient carries duplicates, and at ``OVERFLOW_STEP`` the duplicates are finite one by one
  but overflow once summed (coalesced). Coefficients and the projection are powers of two, so every
  clean sum is exact in any order and in any precision.

Why they ship inside ``harness``: ``python -m harness.parity`` must run its embedded default matrix
from an installed package. Each is a :class:`~harness.parity.Workload` made by a module-level
factory, exactly as a user's workload is (``harness.parity.workload.registry`` registers them by name).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from harness.parity.workload.registry import OVERFLOW_INDEX, OVERFLOW_STEP
from harness.parity.workload.spec import Workload


# -- models ---------------------------------------------------------------------------------------
class Block(nn.Module):
    """``Linear`` + ``ReLU``: the FSDP unit of the nested MLP."""

    def __init__(self, width_in: int, width_out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width_in, width_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class NestedMLP(nn.Module):
    """``16 -> 32 -> (32 -> 32 -> 32) -> 4``: FSDP wraps each block, ``inner`` around two of them
    (a unit that owns no parameter of its own) and the root: units three levels deep."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = Block(16, 32)
        self.inner = nn.Sequential(Block(32, 32), Block(32, 32))
        self.out = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.inner(self.inp(x)))


class Gain(nn.Module):
    """One learnable scalar: sharded over 2+ ranks, every rank but rank 0 holds an empty shard."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((1,), 1.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


class FrozenMLP(nn.Module):
    """A frozen first layer, a trainable block and a one-element gain in its own unit."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = Block(16, 32)
        self.frozen.requires_grad_(False)
        self.body = Block(32, 32)
        self.gain = Gain()
        self.out = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.gain(self.body(self.frozen(x))))


class Attention(nn.Module):
    """Single-head causal self-attention (written out, so every precision takes the same path)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).triu(1)
        weights = scores.masked_fill(causal, float("-inf")).softmax(dim=-1)
        return self.proj(weights @ v)


class TransformerBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = Attention(width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TiedTransformer(nn.Module):
    """Token embedding, two blocks, and an output head whose weight *is* the embedding weight."""

    vocab = 32
    width = 16

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(self.vocab, self.width)
        self.blocks = nn.ModuleList(TransformerBlock(self.width) for _ in range(2))
        self.norm = nn.LayerNorm(self.width)
        self.head = nn.Linear(self.width, self.vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class SparseEmbedding(nn.Module):
    """``nn.Embedding(sparse=True)`` summed against a fixed projection (a buffer, not trained)."""

    vocab = 16
    width = 4

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(self.vocab, self.width, sparse=True)
        self.register_buffer("projection", torch.tensor([1.0, 0.5, -0.25, 2.0]))

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        return self.embed(indices).float() @ self.projection.float()


# -- data and losses ----------------------------------------------------------------------------
def _mlp_batch(rank: int, step: int) -> torch.Tensor:
    return torch.randn(8, 16)


def _square_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).float().pow(2).mean()


def _token_batch(rank: int, step: int) -> torch.Tensor:
    return torch.randint(0, TiedTransformer.vocab, (4, 9))


def _next_token_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1]).float()
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


_CLEAN_COEFFICIENT = 0.25


def overflow_coefficient(dtype: torch.dtype, scale: float) -> float:
    """A power of two ``c`` for the overflow step: at loss scale ``scale`` every gradient entry is
    finite in ``dtype``, but the coalesced sum at ``OVERFLOW_INDEX`` is not.

    One occurrence of an index contributes ``c * projection * scale`` to the local gradient
    (``c * projection * scale / world_size`` once averaged over ranks); the projection's largest
    entry is 2. Every rank repeats the index 3 times, so the coalesced sum is ``6 * c * scale``
    whatever the world size. With ``c * scale`` in ``[max / 6, max / 3)`` one entry (``2 * c *
    scale``) stays below ``max`` while the sum reaches it.
    """
    limit = torch.finfo(dtype).max
    return 2.0 ** math.ceil(math.log2(limit / (6 * scale)))


def _embedding_batch(rank: int, step: int) -> dict[str, Any]:
    indices = torch.randint(0, SparseEmbedding.vocab, (6,))
    indices[:2] = indices[2]  # duplicated indices in every batch
    if step == OVERFLOW_STEP:
        indices[:3] = OVERFLOW_INDEX
    return {"indices": indices, "coefficient": _CLEAN_COEFFICIENT, "overflow": step == OVERFLOW_STEP}


def _embedding_finish(batch: dict[str, Any], dtype: torch.dtype, scale: float) -> dict[str, Any]:
    if not batch["overflow"]:
        return batch
    return {**batch, "coefficient": overflow_coefficient(dtype, scale)}


def _embedding_loss(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    return (model(batch["indices"]) * batch["coefficient"]).sum()


def _embedding_joint_losses(model: nn.Module, batches: list[dict[str, Any]]) -> list[torch.Tensor]:
    """One embedding lookup over every batch (one sparse gradient, one backward), then each batch's
    loss computed from its own rows alone, in a fresh tensor shaped as a rank's own forward shapes
    it: the lookup is a gather (exact in any shape), but a matmul over 12 rows may take another CPU
    kernel path than one over 6 and round the last bit differently (AVX-512 MKL, or
    ``ATEN_CPU_CAPABILITY=default``), so the shape-dependent part runs on the candidate's shapes."""
    rows = model.embed(torch.cat([batch["indices"] for batch in batches]))
    parts = rows.split([len(batch["indices"]) for batch in batches])
    projection = model.projection.float()
    return [
        ((part.clone().float() @ projection) * batch["coefficient"]).sum()
        for part, batch in zip(parts, batches, strict=True)
    ]


# -- factories ----------------------------------------------------------------------------------


def mlp() -> Workload:
    return Workload(
        name="mlp",
        model=NestedMLP,
        batch=_mlp_batch,
        loss=_square_loss,
        units=(Block, nn.Sequential),  # the blocks, and ``inner`` around two of them
    )


def transformer() -> Workload:
    return Workload(
        name="transformer",
        model=TiedTransformer,
        batch=_token_batch,
        loss=_next_token_loss,
        units=(TransformerBlock,),
    )


def frozen() -> Workload:
    return Workload(
        name="frozen",
        model=FrozenMLP,
        batch=_mlp_batch,
        loss=_square_loss,
        units=(Block, Gain),
    )


def embedding() -> Workload:
    return Workload(
        name="embedding",
        model=SparseEmbedding,
        batch=_embedding_batch,
        loss=_embedding_loss,
        sparse=True,
        finish_batch=_embedding_finish,
        joint_losses=_embedding_joint_losses,
    )
