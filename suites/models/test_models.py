"""Real Hugging Face architectures train under FSDP1 and FSDP2 exactly as under DDP.

Tiny, randomly initialised configurations of Llama, Mixtral, GPT-2, BERT and T5
(``suites/models/workloads.py``), each through its workload's whole matrix under ``make models``
(every engine, sharding, precision, optimizer and planted fault), a handful of rows under
``make test`` (``support.rows``). Every row must pass; rows that cannot run here are skipped with
the reason (HYBRID_SHARD at world size 2, FSDP1 CPU offload without an accelerator).
"""

import pytest

from harness.parity.plan.config import Layout, Precision
from suites.models.support import INSTALL_HINT, rows

pytest.importorskip(
    "transformers", reason=f"the real-model tier needs Hugging Face transformers: {INSTALL_HINT}"
)

from harness.parity import parity_test  # noqa: E402 - after the skip: nothing to import without transformers
from suites.models import workloads  # noqa: E402


@parity_test(workloads.llama, k=rows("hf_llama", "fsdp1-full_shard-orig-bf16-sgd-hf_llama-w2"))
def test_hf_llama_with_tied_embeddings_trains_like_ddp(parity):
    assert parity.passed, parity.explanation


@parity_test(workloads.mixtral, k=rows("hf_mixtral"))
def test_hf_mixtral_with_idle_experts_and_a_router_loss_trains_like_ddp(parity):
    assert parity.passed, parity.explanation


@parity_test(workloads.gpt2, k=rows("hf_gpt2"))
def test_hf_gpt2_with_dropout_trains_like_ddp(parity):
    assert parity.passed, parity.explanation


@parity_test(workloads.bert, k=rows("hf_bert"))
def test_hf_bert_trains_like_ddp(parity):
    assert parity.passed, parity.explanation


@parity_test(workloads.t5, k=rows("hf_t5"))
def test_hf_t5_encoder_decoder_with_relative_attention_bias_trains_like_ddp(parity):
    assert parity.passed, parity.explanation


def test_mixtral_leaves_some_experts_without_tokens_on_a_rank():
    """What the Mixtral rows are for: an expert that gets no token on one rank still has a
    gradient slot, and its parameters must be reduced and stepped like everyone else's."""
    import torch

    from harness.parity.workload import registry

    workload = registry.get("suites.models.workloads:mixtral")
    model = registry.build_model(workload, 0)
    ids = registry.make_batch(workload, 0, 0, 0)
    router = model(input_ids=ids, labels=ids).router_logits[0]
    counts = torch.bincount(router.topk(2, dim=-1).indices.flatten(), minlength=8)
    assert (counts == 0).any(), counts


def test_each_architecture_gets_the_units_its_class_names():
    from harness.parity.workload import registry, units

    chosen = {}
    for factory in ("llama", "mixtral", "gpt2", "bert", "t5"):
        workload = registry.get(f"suites.models.workloads:{factory}")
        chosen[factory] = units.describe(workload, registry.build_model(workload, 0))
    assert chosen == {
        "llama": "LlamaDecoderLayer (auto, from LlamaForCausalLM._no_split_modules)",
        "mixtral": "MixtralDecoderLayer (auto, from MixtralForCausalLM._no_split_modules)",
        "gpt2": "GPT2Block (auto, from GPT2LMHeadModel._no_split_modules)",
        "bert": "BertLayer",
        "t5": "T5Block (auto, from T5ForConditionalGeneration._no_split_modules)",
    }


def test_a_llama_whose_rotary_buffer_is_cast_by_hand_is_told_which_buffer_and_dtypes(module_ranks):
    """transformers#25681: a user casts the model's buffers to bf16 by hand under FSDP2 (which
    keeps them as they were): the report names the buffer, in the module that diverges first."""
    from fixtures.parity_plants import Plant, planted_executor
    from harness.parity.doors import runner
    from harness.parity.plan.config import ParityConfig

    plant = Plant(kind="cast_buffer", module="model.rotary_emb.inv_freq")

    config = ParityConfig(
        engine="fsdp2",
        workload="suites.models.workloads:llama",
        steps=2,
        layout=Layout(reshard_after_forward=True),
        precision=Precision(dtype="bf16"),
    )
    (outcome,) = runner.run([config], planted_executor(module_ranks, plant))
    (cause,) = [c for c in outcome.result.causes if c.name == "dtype_differs"]
    assert (
        "model.rotary_emb.inv_freq is bfloat16 in the candidate and float32 in the reference"
        in cause.evidence
    )
    assert outcome.result.localization.first.module.startswith("model.rotary_emb")
