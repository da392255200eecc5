"""Real architectures from Hugging Face ``transformers``, tiny and randomly initialised, as workloads.

Why these five: they are what people shard, and each brings something our own built-ins lack:
Llama (a float32 rotary ``inv_freq`` buffer FSDP2 never casts, tied embeddings), Mixtral (a
router whose experts may get no tokens on a rank, and its auxiliary load-balancing loss), GPT-2
(dropout everywhere, a tied head), BERT (token-type and position buffers, no
``_no_split_modules``) and T5 (encoder-decoder, a relative attention bias computed in the first
block only and handed to the others). Built from config objects: nothing is downloaded. Sizes are
even (vocabulary 256, hidden 64) so that every parameter's rows split evenly over 2 and 4 ranks.

Run one: ``python -m harness.parity --workload suites.models.workloads:llama``.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from harness.parity import Workload
from suites.models.support import INSTALL_HINT

try:
    import transformers
except ImportError:  # pragma: no cover - the suite skips at collection without it
    transformers = None

VOCAB, HIDDEN, SEQ, BATCH = 256, 64, 16, 4


def _need() -> Any:
    if transformers is None:
        raise ImportError(f"the real-model workloads need Hugging Face transformers: {INSTALL_HINT}")
    return transformers


def _tokens(rank: int, step: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ))


def _causal_lm_loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss


def _llama_model(heads: int, kv_heads: int, tied: bool = True) -> Any:
    """A builder of a tiny ``LlamaForCausalLM`` with tied embeddings (``tied``) and ``heads`` query
    heads over ``kv_heads`` key-value heads."""
    t = _need()
    config = t.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=SEQ,
        tie_word_embeddings=tied,
    )
    return lambda: t.LlamaForCausalLM(config)


def llama() -> Workload:
    """``LlamaForCausalLM`` with tied embeddings; units from ``_no_split_modules``, the TP plan from
    ``config.base_model_tp_plan``."""
    return Workload(
        name="hf_llama",
        model=_llama_model(4, 2),
        batch=_tokens,
        loss=_causal_lm_loss,
        units="auto",
        tp_plan="auto",  # LlamaConfig.base_model_tp_plan: its 2-D rows (--tp 2) at world size 4
        pp_split="auto",  # its pipeline rows (--pp 2): embedding, layers, norm and head cut evenly
    )


def llama_wide() -> Workload:
    """:func:`llama` with 8 heads over 4 key-value heads: tensor parallelism gives each rank whole
    key-value heads, so its rows at tp 4 need four of them."""
    return dataclasses.replace(llama(), name="hf_llama_wide", model=_llama_model(8, 4))


def mixtral() -> Workload:
    """``MixtralForCausalLM``: 8 experts, top 2, over 16 tokens a rank (some experts get none),
    with the router's load-balancing loss in the loss."""
    t = _need()
    config = t.MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
        num_local_experts=8,
        num_experts_per_tok=2,
        output_router_logits=True,
        router_aux_loss_coef=0.02,
    )
    return Workload(
        name="hf_mixtral",
        model=lambda: t.MixtralForCausalLM(config),
        batch=lambda rank, step: torch.randint(0, VOCAB, (2, 8)),
        loss=_causal_lm_loss,
        units="auto",
    )


def mixtral_without_router_loss() -> Workload:
    """:func:`mixtral` without the router's load-balancing loss: a sum over tokens alone."""
    t = _need()
    base = mixtral()
    config = base.model().config
    config.router_aux_loss_coef = 0.0
    config.output_router_logits = False
    return dataclasses.replace(base, name="hf_mixtral_plain", model=lambda: t.MixtralForCausalLM(config))


def gpt2() -> Workload:
    """``GPT2LMHeadModel`` with its default dropout (0.1 on embeddings, attention and residuals)."""
    t = _need()
    config = t.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=2, n_head=4, n_positions=SEQ)
    return Workload(
        name="hf_gpt2",
        model=lambda: t.GPT2LMHeadModel(config),
        batch=_tokens,
        loss=_causal_lm_loss,
        units="auto",
    )


def bert() -> Workload:
    """``BertForMaskedLM``; its class names no ``_no_split_modules``, so the units are explicit."""
    t = _need()
    config = t.BertConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=2 * HIDDEN,
        max_position_embeddings=SEQ,
    )
    from transformers.models.bert.modeling_bert import BertLayer

    return Workload(
        name="hf_bert",
        model=lambda: t.BertForMaskedLM(config),
        batch=_tokens,
        loss=_causal_lm_loss,
        units=(BertLayer,),
    )


def t5() -> Workload:
    """``T5ForConditionalGeneration``: encoder and decoder stacks, relative attention bias."""
    t = _need()
    config = t.T5Config(
        vocab_size=VOCAB,
        d_model=HIDDEN,
        d_kv=16,
        d_ff=2 * HIDDEN,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        decoder_start_token_id=0,
    )
    return Workload(
        name="hf_t5",
        model=lambda: t.T5ForConditionalGeneration(config),
        batch=lambda rank, step: (torch.randint(0, VOCAB, (BATCH, SEQ)), torch.randint(0, VOCAB, (BATCH, 8))),
        # Training needs no key/value cache, and a checkpointed decoder block that appends to one
        # recomputes with another cache than it ran with (torch.utils.checkpoint's CheckpointError:
        # "a different number of tensors was saved"): as Hugging Face's own gradient checkpointing
        # does, the loop trains with use_cache=False.
        loss=lambda model, batch: model(input_ids=batch[0], labels=batch[1], use_cache=False).loss,
        units="auto",
    )


def _shard_layers(model: torch.nn.Module, mesh: Any, *, root: bool = True) -> torch.nn.Module:
    """A user's own function over a Hugging Face decoder: ``fully_shard`` per decoder layer in
    bf16 with a float32 reduce, then at the root (``root=False``: the root forgotten, a plant)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    if root:
        fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def llama_function() -> Workload:
    """The Llama above, parallelized by the user's own function and clipped at 0.5 (clipping's
    norm sums otherwise under sharding: the staged check's row)."""
    return dataclasses.replace(
        llama(), name="hf_llama_fn", units=(), tp_plan=None, parallelize=_shard_layers, clip=0.5
    )


def llama_function_without_root() -> Workload:
    """PLANT: the same function with the root never sharded (embeddings, final norm never reduced)."""
    return dataclasses.replace(
        llama_function(),
        name="hf_llama_noroot",
        parallelize=lambda model, mesh: _shard_layers(model, mesh, root=False),
        clip=None,
    )


class _Skipped(torch.nn.Module):
    """A decoder layer another stage holds: the hidden states handed on."""

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return hidden_states


def _llama_stage(model: torch.nn.Module, stage: int, stages: int) -> torch.nn.Module:
    """A user's cut of a Hugging Face Llama: a copy keeping the model's names, its layers outside
    the stage skipped, the embedding gone after the first stage, the norm and head made identities
    before the last; its forward takes the tokens (first stage) or the hidden states and returns
    the ``logits`` field (the last stage's logits, elsewhere the hidden states)."""
    import types

    part = copy.deepcopy(model)
    layers = part.model.layers
    per = len(layers) // stages
    for index in range(len(layers)):
        if not stage * per <= index < (stage + 1) * per:
            layers[index] = _Skipped()
    first = stage == 0
    if not first:
        part.model.embed_tokens = None
    if stage != stages - 1:
        part.model.norm = torch.nn.Identity()
        part.lm_head = torch.nn.Identity()

    def forward(self: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        key = "input_ids" if first else "inputs_embeds"
        return type(self).forward(self, **{key: inputs}, use_cache=False).logits  # type: ignore[no-any-return]

    part.forward = types.MethodType(forward, part)  # type: ignore[method-assign]
    return part


def _next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    vocab = logits.shape[-1]
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].float().reshape(-1, vocab), labels[:, 1:].reshape(-1)
    )


def _pipeline_llama(model: torch.nn.Module, mesh: Any) -> Any:
    """A user's pipeline over a Hugging Face Llama (torchtitan's recipe): each rank's stage cut
    from the model, ``fully_shard`` per layer and at the stage in bf16 with a float32 reduce over
    ``dp``, 1F1B over two microbatches with the user's loss."""
    from torch.distributed import pipelining
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    pp = mesh["pp"]
    stage, stages = pp.get_local_rank(), pp.size()
    part = _llama_stage(model, stage, stages)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in part.model.layers:
        if not isinstance(layer, _Skipped):
            fully_shard(layer, mesh=mesh["dp"], mp_policy=policy)
    fully_shard(part, mesh=mesh["dp"], mp_policy=policy)
    device = next(model.parameters()).device
    built = pipelining.PipelineStage(part, stage, stages, device, group=pp.get_group())
    return pipelining.Schedule1F1B(built, n_microbatches=2, loss_fn=_next_token_loss)


def llama_pipeline_function() -> Workload:
    """An untied Llama whose pipeline the user's own function builds (``--mesh pp=2,dp=1``)."""
    return dataclasses.replace(
        llama(),
        name="hf_llama_pp_fn",
        model=_llama_model(4, 2, tied=False),
        units=(),
        tp_plan=None,
        pp_split=None,
        parallelize=_pipeline_llama,
    )
