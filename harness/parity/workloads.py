"""The models and data the parity matrix trains: deterministic, small, and each chosen for a bug class.

Why these four (and why they ship inside ``harness``): ``python -m harness.parity`` must run its
embedded default matrix from an installed package, so the workloads live here, not in a test tree.

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

Every rank builds the model from the same seed (identical initial weights); batches are drawn on
the CPU from a generator seeded by ``(seed, rank, step)``, then moved to the device, so the
reference and the candidate see the same data on the same rank.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def data_generator(seed: int, rank: int, step: int) -> torch.Generator:
    """The generator for one rank's batch of one step (distinct for every ``(seed, rank, step)``)."""
    return torch.Generator().manual_seed(1_000_003 * seed + 10_007 * rank + step)


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


# -- workloads ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """A model, how FSDP wraps it, its data and its loss."""

    name: str
    build: Callable[[], nn.Module]
    """Builds the model in float32 (call under a fixed seed: every rank must get the same weights)."""
    units: tuple[type[nn.Module], ...]
    """Module classes wrapped as FSDP units of their own (the root is always wrapped too)."""
    make_batch: Callable[[torch.Generator, int], Any]
    """``(generator, step) -> batch`` on the CPU."""
    loss: Callable[[nn.Module, Any], torch.Tensor]
    """``(model, batch) -> float32 scalar loss``; the model may run in low precision."""
    first_unit: str
    """Parameter-name prefix of the first optimizer when a run uses two optimizers."""
    sparse: bool = False
    """Sparse gradients: trained in the run's precision throughout (no fp32 master weights)."""
    finish_batch: Callable[[Any, torch.dtype, float], Any] | None = None
    """``(batch, dtype, current scale) -> batch``, for data that depends on the loss scale."""
    joint_losses: Callable[[nn.Module, list[Any]], list[torch.Tensor]] | None = None
    """``(model, batches) -> one loss per batch`` from a single forward pass, for models whose
    gradient must come out of one backward call (a sparse gradient accumulated over several
    forward passes needs ``add`` on sparse tensors, which the CPU lacks for fp16)."""

    def losses(self, model: nn.Module, batches: list[Any]) -> list[torch.Tensor]:
        """One loss per batch (the single-process reference trains on every rank's batch)."""
        if self.joint_losses is not None:
            return self.joint_losses(model, batches)
        return [self.loss(model, batch) for batch in batches]


def _mlp_batch(generator: torch.Generator, step: int) -> torch.Tensor:
    return torch.randn(8, 16, generator=generator)


def _square_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).float().pow(2).mean()


def _token_batch(generator: torch.Generator, step: int) -> torch.Tensor:
    return torch.randint(0, TiedTransformer.vocab, (4, 9), generator=generator)


def _next_token_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1]).float()
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


OVERFLOW_STEP = 3
"""The step of the ``embedding`` workload whose duplicated indices overflow once coalesced."""
OVERFLOW_INDEX = 5
"""The index every rank repeats three times in that step."""
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


def _embedding_batch(generator: torch.Generator, step: int) -> dict[str, Any]:
    indices = torch.randint(0, SparseEmbedding.vocab, (6,), generator=generator)
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


WORKLOADS: dict[str, Workload] = {
    "mlp": Workload(
        name="mlp",
        build=NestedMLP,
        units=(Block, nn.Sequential),  # the blocks, and ``inner`` around two of them
        make_batch=_mlp_batch,
        loss=_square_loss,
        first_unit="inp.",
    ),
    "transformer": Workload(
        name="transformer",
        build=TiedTransformer,
        units=(TransformerBlock,),
        make_batch=_token_batch,
        loss=_next_token_loss,
        first_unit="blocks.0.",
    ),
    "frozen": Workload(
        name="frozen",
        build=FrozenMLP,
        units=(Block, Gain),
        make_batch=_mlp_batch,
        loss=_square_loss,
        first_unit="body.",
    ),
    "embedding": Workload(
        name="embedding",
        build=SparseEmbedding,
        units=(),
        make_batch=_embedding_batch,
        loss=_embedding_loss,
        first_unit="embed.",
        sparse=True,
        finish_batch=_embedding_finish,
        joint_losses=_embedding_joint_losses,
    ),
}


def get(name: str) -> Workload:
    """The workload called ``name``; an unknown name is a ``ValueError`` listing the known ones."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"workload must be one of {sorted(WORKLOADS)}, got {name!r}") from None


def build_model(workload: Workload, seed: int) -> nn.Module:
    """The workload's float32 model with weights drawn from ``seed`` (identical on every rank)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return workload.build()
