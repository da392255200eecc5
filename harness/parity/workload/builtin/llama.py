"""``llama``: a small Llama-style decoder, the first worked example of writing a workload.

What it exercises that the toys do not: RMSNorm computed in float32 inside a low-precision model,
rotary position embeddings (computed in forward from positions, so no buffer whose dtype FSDP1's
``buffer_dtype`` and FSDP2 would treat differently), grouped heads through
``scaled_dot_product_attention``, a SwiGLU feed-forward, and an output head tied to the token
embedding that lives in the root unit while the decoder layers are units of their own.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from harness.parity.workload.spec import Workload

VOCAB = 64
WIDTH = 32
HEADS = 4
"""Four heads: tensor parallelism gives each rank whole heads, so the decoder splits up to ``--tp 4``."""
HEAD_WIDTH = WIDTH // HEADS
LAYERS = 2
SEQUENCE = 16


class RMSNorm(nn.Module):
    """``x / rms(x) * weight``, the division in float32 whatever the model's dtype (as Llama does)."""

    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rotate(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of ``x`` (batch, heads, positions, head width): each pair of
    features turned by an angle that grows with the position."""
    half = x.shape[-1] // 2
    frequencies = 10_000.0 ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = torch.arange(x.shape[-2], device=x.device, dtype=torch.float32)[:, None] * frequencies
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(WIDTH, WIDTH, bias=False)
        self.k = nn.Linear(WIDTH, WIDTH, bias=False)
        self.v = nn.Linear(WIDTH, WIDTH, bias=False)
        self.o = nn.Linear(WIDTH, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, positions, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            # -1 heads: under tensor parallelism a rank holds its share of them (q, k, v colwise)
            return t.view(batch, positions, -1, HEAD_WIDTH).transpose(1, 2)

        q, k, v = rotate(heads(self.q(x))), rotate(heads(self.k(x))), heads(self.v(x))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(attended.transpose(1, 2).reshape(batch, positions, -1))


class SwiGLU(nn.Module):
    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.gate = nn.Linear(WIDTH, hidden, bias=False)
        self.up = nn.Linear(WIDTH, hidden, bias=False)
        self.down = nn.Linear(hidden, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class DecoderLayer(nn.Module):
    """Pre-norm attention and feed-forward, each added to the residual stream: the FSDP unit."""

    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(WIDTH)
        self.attention = Attention()
        self.ffn_norm = RMSNorm(WIDTH)
        self.ffn = SwiGLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class Decoder(nn.Module):
    """Token embedding, decoder layers, a final RMSNorm and an output head tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        # A ModuleDict keyed "0", "1", ... (the names a ModuleList gives): a pipeline stage drops
        # the layers it does not hold and keeps the others' names (torchtitan's convention).
        self.layers = nn.ModuleDict({str(index): DecoderLayer() for index in range(LAYERS)})
        self.norm = RMSNorm(WIDTH)
        self.output = nn.Linear(WIDTH, VOCAB, bias=False)
        self.output.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """The whole model, or a pipeline stage of it: a module the stage does not hold is ``None``."""
        x = self.embed(tokens) if self.embed is not None else tokens
        for layer in self.layers.values():
            x = layer(x)
        x = self.norm(x) if self.norm is not None else x
        return self.output(x) if self.output is not None else x


def token_batch(rank: int, step: int) -> torch.Tensor:
    """Four sequences of ``SEQUENCE + 1`` tokens (inputs and next-token targets)."""
    return torch.randint(0, VOCAB, (4, SEQUENCE + 1))


def next_token_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    return logits_loss(model(tokens[:, :-1]), tokens[:, 1:])


def logits_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of next-token ``logits`` (in float32) against ``targets``: the loss of the
    whole model and of a pipeline's last stage alike."""
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))


def next_token_io(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A pipeline's input and target: the tokens, and the same tokens one position on."""
    return tokens[:, :-1], tokens[:, 1:]


def tp_plan() -> dict[str, object]:
    """Megatron's split of a decoder layer, as torchtitan writes it: q, k, v and the feed-forward's
    gate and up by output columns (each TP rank its heads, its hidden units), o and down by input
    rows (their partial products summed across the TP group). Norms, the embedding and the tied
    head stay replicated."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    columns = [f"layers.*.attention.{n}" for n in ("q", "k", "v")] + ["layers.*.ffn.gate", "layers.*.ffn.up"]
    plan: dict[str, object] = {name: ColwiseParallel() for name in columns}
    plan.update({"layers.*.attention.o": RowwiseParallel(), "layers.*.ffn.down": RowwiseParallel()})
    return plan


def sequence_parallel_plan() -> dict[str, object]:
    """:func:`tp_plan` with sequence parallelism, as torchtitan writes it: between the blocks each
    TP rank holds its share of the positions (``Shard(1)``), the norms run on that share
    (``SequenceParallel``, their weights' gradients summed across the TP group), each block
    all-gathers its input and its closing linear reduce-scatters its output. The embedding and the
    tied head stay whole: the first layer takes its share of the embedded positions, the head
    all-gathers them back."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, RowwiseParallel, SequenceParallel

    def gather_input() -> PrepareModuleInput:
        return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))

    plan: dict[str, object] = {
        "layers.0": PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True
        ),
        **tp_plan(),
        "layers.*.attention_norm": SequenceParallel(),
        "layers.*.attention": gather_input(),
        "layers.*.attention.o": RowwiseParallel(output_layouts=Shard(1)),
        "layers.*.ffn_norm": SequenceParallel(),
        "layers.*.ffn": gather_input(),
        "layers.*.ffn.down": RowwiseParallel(output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
        ),
    }
    return plan


def llama() -> Workload:
    return Workload(
        name="llama",
        model=Decoder,
        batch=token_batch,
        loss=next_token_loss,
        units=(DecoderLayer,),
        tp_plan=tp_plan(),
        pp_split="auto",
        pp_io=next_token_io,
        pp_loss=logits_loss,
    )
