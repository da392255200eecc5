"""The ``two_d`` tier (``make two-d``): the whole 2-D matrix at world size 4 of the built-in
Llama-style decoder and of tiny Hugging Face Llama (its plan read from ``base_model_tp_plan``):
HSDP 2 x 2 and 4 x 1 and FSDP2 + TP dp 2 x tp 2 (and the decoder's TP rows again under a
sequence-parallel plan); the TP rows again at tp 4 (the decoder, its sequence-parallel plan, and a
Llama with 8 heads over 4 key-value heads), and a residual MLP with biases at tp 2 and 4; in
fp32, bf16 and bf16 reducing in float32, SGD
and AdamW, under the scaler, and an inf on one rank. Every row must pass bitwise (``exact``): the
references mirror HSDP's two stages and TP's split matmuls (``test_two_d.py`` says why, and plants
the bugs these rows would show).
"""

from __future__ import annotations

import importlib.util

import pytest

from harness.parity.doors import runner
from harness.parity.plan.matrices import two_d as two_d_matrix
from suites.parity.support import ranks_executor

pytestmark = pytest.mark.two_d

HF_LLAMA = "suites.models.workloads:llama"
WORKLOADS = ["llama"] + ([HF_LLAMA] if importlib.util.find_spec("transformers") is not None else [])
SEQUENCE_PARALLEL = "fixtures.two_d_workloads:llama_sp"
"""The decoder under torchtitan's sequence-parallel plan (its TP rows; its HSDP rows are llama's)."""
ROWS = [config for workload in WORKLOADS for config in two_d_matrix.rows(workload, world_size=4)]
ROWS += [
    config for config in two_d_matrix.rows(SEQUENCE_PARALLEL, world_size=4) if config.mesh.tp is not None
]
BIASED = "fixtures.user_workloads:biased_mlp"
HF_LLAMA_WIDE = "suites.models.workloads:llama_wide"
TP4_WORKLOADS = ["llama", SEQUENCE_PARALLEL, BIASED] + (
    [HF_LLAMA_WIDE] if importlib.util.find_spec("transformers") is not None else []
)
TP4_ROWS = [
    config
    for workload in TP4_WORKLOADS
    for config in two_d_matrix.rows(workload, world_size=4, tp=4)
    if config.mesh.tp is not None
]
"""TP of degree 4: each partial sum has four addends, summed in the ring's order through the
candidate's own collective (``tp/mirror._Reducer``)."""
ROWS += TP4_ROWS
ROWS += [config for config in two_d_matrix.rows(BIASED, world_size=4) if config.mesh.tp is not None]


@pytest.fixture(scope="module")
def verdicts(module_ranks):
    """``{config id: ParityResult}`` of every 2-D row, in one run."""
    return {o.result.config.id: o.result for o in runner.run(ROWS, ranks_executor(module_ranks))}


@pytest.mark.parametrize("config", ROWS, ids=lambda c: c.id)
def test_every_2d_row_passes_bitwise_at_world_size_4(verdicts, config):
    result = verdicts[config.id]
    assert (result.status, result.profile, result.closeness) == ("pass", "exact", "bitwise"), result.reason


def test_the_tier_covers_the_built_in_decoder_and_says_when_hugging_face_llama_is_missing():
    """Without transformers the Hugging Face rows are left out (the model tier says how to install
    it); the decoder's 27 rows run either way."""
    assert sum(c.workload == "llama" for c in ROWS) == 27 + 9
    assert sum(c.workload == BIASED for c in ROWS) == 9 + 9
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed: the tiny Hugging Face Llama's 2-D rows are left out")
    assert sum(c.workload == HF_LLAMA for c in ROWS) == 27


WS8_ROWS = [
    config
    for workload in ("llama", SEQUENCE_PARALLEL)
    for config in two_d_matrix.rows(workload, world_size=8)
    if config.optimizer == "sgd" and not config.faults and (config.mesh.tp is not None or workload == "llama")
]
WS8_ROWS += [
    config
    for workload in ["llama", SEQUENCE_PARALLEL, BIASED, *TP4_WORKLOADS[3:]]  # and the 8-head Llama
    for config in two_d_matrix.rows(workload, world_size=8, tp=4)
    if config.optimizer == "sgd" and not config.faults and config.mesh.tp is not None
]
"""At world size 8 (the ``world_sizes`` tier): HSDP 2 x 4 and 8 x 1, FSDP2 + TP dp 4 x tp 2 and dp 2 x tp 4,
where four ranks sum each element of the data-parallel reduction in the ring's order: the TP
reference reduces each TP coordinate's buffer of shares (``reduce_layout._tp_bucket``), or its
rows fail by rounding (measured: 3 of 4 TP rows before it)."""


@pytest.fixture(scope="module")
def verdicts_at_8(module_ranks):
    return {o.result.config.id: o.result for o in runner.run(WS8_ROWS, ranks_executor(module_ranks))}


@pytest.mark.world_sizes
@pytest.mark.parametrize("config", WS8_ROWS, ids=lambda c: c.id)
def test_every_2d_row_passes_bitwise_at_world_size_8(verdicts_at_8, config):
    result = verdicts_at_8[config.id]
    assert (result.status, result.profile, result.closeness) == ("pass", "exact", "bitwise"), result.reason
