"""``pp_split="auto"`` on a Hugging Face decoder (``LlamaForCausalLM`` and its kind): its items, a
stage of it, and the input, target and loss a pipeline feeds it.

Why apart: a Hugging Face decoder is not written for torchtitan's convention (its forward calls
every module it holds), but its forward takes ``inputs_embeds`` instead of token ids, and a
layer, the final norm or the head can be replaced by a module that hands its input on. So a stage
is the model itself, with every layer outside the stage a :class:`PassThrough`, the norm and the
head ``nn.Identity`` before the last stage, the embedding dropped after the first, run by
:class:`Stage` with the tokens (first stage) or the hidden states (the others) and returning the
``logits`` field: on the last stage the logits, elsewhere the hidden states. Parameter names stay
the whole model's (the wrapper's part ``_pp_stage`` is dropped from names like a wrapper's).

Measured: a tiny ``LlamaForCausalLM`` run this way, stage by stage, gives the whole model's logits
bitwise, and its pipeline rows pass bitwise (``suites/models``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

WRAPPER = "_pp_stage"
"""The name :class:`Stage` holds the model under (dropped from parameter names)."""


def decoder(model: nn.Module) -> str | None:
    """The attribute holding ``model``'s decoder (``"model"``) when it is a Hugging Face causal LM
    whose decoder has ``embed_tokens``, a ``layers`` list and a ``norm``, and which has an
    ``lm_head``; ``None`` otherwise."""
    prefix = getattr(model, "base_model_prefix", None)
    base = getattr(model, prefix, None) if isinstance(prefix, str) else None
    if base is None or not isinstance(getattr(model, "lm_head", None), nn.Module):
        return None
    if not all(hasattr(base, name) for name in ("embed_tokens", "layers", "norm")):
        return None
    return prefix if isinstance(base.layers, nn.ModuleList) else None


def items(model: nn.Module, prefix: str) -> list[str]:
    """The embedding, each layer, the final norm and the head, in the forward's order."""
    base = getattr(model, prefix)
    layers = [f"{prefix}.layers.{index}" for index in range(len(base.layers))]
    return [f"{prefix}.embed_tokens", *layers, f"{prefix}.norm", "lm_head"]


class PassThrough(nn.Module):
    """A decoder layer outside the stage: its hidden states handed on unchanged."""

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return hidden_states


class Stage(nn.Module):
    """A stage of a Hugging Face decoder: the tokens (first stage) or the hidden states in, the
    ``logits`` field out."""

    def __init__(self, model: nn.Module, first: bool) -> None:
        super().__init__()
        self.add_module(WRAPPER, model)
        self.first = first

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        key = "input_ids" if self.first else "inputs_embeds"
        logits = getattr(self, WRAPPER)(**{key: inputs}, use_cache=False).logits
        # A view of the hidden states before the last stage (the model slices them for its head):
        # the zero-bubble schedules detach a stage's output in place, which a view refuses. The
        # copy changes no value.
        return logits.clone() if logits._base is not None else logits


def cut(model: nn.Module, prefix: str, kept: list[str]) -> nn.Module:
    """``model`` (cut in place) as the :class:`Stage` holding ``kept``."""
    base = getattr(model, prefix)
    for item in items(model, prefix):
        if item in kept:
            continue
        if item.endswith(".embed_tokens"):
            base.register_module("embed_tokens", None)
        elif item.endswith(".norm"):
            base.register_module("norm", nn.Identity())
        elif item == "lm_head":
            model.register_module("lm_head", nn.Identity())
        else:
            base.layers[int(item.rpartition(".")[2])] = PassThrough()
    return Stage(model, first=f"{prefix}.embed_tokens" in kept)


def whole_logits(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """The whole model's logits on token ids, run as :class:`Stage` runs each stage."""
    return model(input_ids=inputs, use_cache=False).logits


def io(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A causal LM's pipeline input and target: token ids (a tensor, or a dict's ``input_ids``)
    and labels (the dict's ``labels``, else the ids themselves)."""
    if isinstance(batch, dict):
        return batch["input_ids"], batch.get("labels", batch["input_ids"])
    return batch, batch


def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of one microbatch in float32, labels ``-100`` ignored (a mean over
    the microbatch's counted tokens, as a causal LM's own loss)."""
    vocab = logits.shape[-1]
    shifted = logits[:, :-1].float().reshape(-1, vocab)
    return F.cross_entropy(shifted, labels[:, 1:].reshape(-1), ignore_index=-100)
