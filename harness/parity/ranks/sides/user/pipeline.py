"""A user's ``parallelize`` function that builds a pipeline (rank side): what it built, read.

Why: under pipeline parallelism the function's result is not a model but a schedule (as
torchtitan's ``pipeline_llm`` returns one): the function cuts the model into stages itself,
``fully_shard``-s each over its data-parallel ranks, wraps each in a ``PipelineStage`` and builds
the schedule with its own loss and microbatch count. Everything the twin must mirror is read off
that schedule: its class (the order it adds microbatches in), its microbatch count, its loss, and
each stage's ``fully_shard`` units (``discover.read`` per stage module). Each rank sees its own
stages only, and every rank's twin is the whole model, so the stages' facts are all-gathered:
:func:`call` is collective.

The stages must keep the model's parameter names (torchtitan's convention: each stage a copy of
the model with the other stages' modules set to ``None``), so each parameter is found in the whole
model by name. Tensor parallelism inside the stages (a ``pp``, ``dp``, ``tp`` mesh) is read per
stage as ``parallelize_module`` applied it, and mirrored on the whole twin. What is not mirrored is
refused naming the way out (``Found.refused``): stages that rename parameters or leave one out, a
tied parameter whose copies land in different stages (nothing inside a parallelize function can
sum their gradients; torchtitan unties them), units in different precision policies, a schedule
class torch does not ship, a compile whose backend cannot be pickled. ``torch.compile`` inside the
stages is mirrored: every stage's compiled modules (their backend objects gathered with the rest)
are compiled alike on the whole twin (``reference.mirror_function``).
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from harness.parity.plan.config import ParityConfig
from harness.parity.plan.config.mesh import SCHEDULES
from harness.parity.ranks.sides.full import gather
from harness.parity.ranks.sides.user import candidate, discover
from harness.parity.ranks.sides.user.found import Compiled, Found
from harness.parity.workload import hf_pipeline, registry
from harness.torch_private import pipelining, tensor_parallel

_KEYS = {name: key for key, (name, _) in SCHEDULES.items()}
"""torch's schedule class name -> its ``SCHEDULES`` key."""


@dataclasses.dataclass(frozen=True, slots=True)
class Built:
    """What the function built, as this rank holds it."""

    schedule: Any
    """The schedule object the function returned (``schedule.step`` trains a step)."""
    stages: tuple[Any, ...]
    """This rank's ``PipelineStage`` objects, in the schedule's order."""
    key: str
    """The schedule's ``SCHEDULES`` key."""
    microbatches: int
    count: int
    """How many stages the pipeline has."""
    loss: Callable[..., torch.Tensor]
    """The schedule's own loss function, as the function gave it."""
    io: Callable[[Any], tuple[torch.Tensor, torch.Tensor]]
    """``batch -> (first stage's input, target)``: the workload's ``pp_io``, or a Hugging Face
    causal LM's token ids and labels."""
    names: frozenset[str]
    """The parameters and buffers this rank's stages hold, by the whole model's names."""
    scale_grads: bool
    """Whether the schedule divides the summed gradients by the microbatch count (torch's default)."""
    stage_of: dict[str, int] = dataclasses.field(default_factory=dict)
    """Every parameter of the whole model (by its names) and the stage holding it, gathered."""

    @property
    def held(self) -> tuple[int, ...]:
        return tuple(stage.stage_index for stage in self.stages)

    def describe(self) -> str:
        divided = "" if self.scale_grads else ", scale_grads=False (gradients summed, not averaged)"
        return (
            f"torch's {type(self.schedule).__name__} over {self.microbatches} microbatches, stages "
            f"{list(self.held)} of {self.count} here{divided}"
        )


def _schedule_of(result: Any, workload: str) -> tuple[Any, tuple[Any, ...]]:
    from torch.distributed.pipelining.schedules import (
        PipelineScheduleMulti,
        PipelineScheduleSingle,
    )

    if isinstance(result, (PipelineScheduleMulti, PipelineScheduleSingle)):
        pipelining.refuse_unsupported(result, dist.get_backend())
        return result, pipelining.stages_of(result)
    raise TypeError(
        f"workload {workload!r}: on a mesh with a 'pp' dimension, parallelize must return the schedule it "
        f"built (e.g. Schedule1F1B(stage, n_microbatches=4, loss_fn=loss)), got {type(result).__name__}"
    )


def _stage_names(stage: Any) -> tuple[list[str], list[str]]:
    """A stage module's parameter (every name of a shared one) and buffer names, the wrappers'
    parts dropped."""
    module = stage.submod
    params = [gather.clean_name(n) for n, _ in module.named_parameters(remove_duplicate=False)]
    return params, [gather.clean_name(n) for n, _ in module.named_buffers()]


def _sendable(compiled: Compiled) -> bool:
    try:
        pickle.dumps(compiled)
    except Exception:  # noqa: BLE001 - any failure to pickle: the spec stays on its rank
        return False
    return True


def _unsendable(found: Found) -> tuple[str, ...]:
    """A compile whose backend cannot travel to the ranks of the other stages (every rank's twin
    compiles every stage's modules with the very backend object the stage was compiled with)."""
    return tuple(
        f"{c.module or '(root)'} is compiled with a backend that cannot be pickled ({c.backend_name}): "
        "every rank's twin compiles every stage alike, so the backend must travel; name it by a string "
        "(backend='inductor') or a module-level function"
        for c in found.compiled
        if not _sendable(c)
    )


def _io(workload: Any, model: nn.Module) -> Callable[[Any], tuple[torch.Tensor, torch.Tensor]]:
    if workload.pp_io is not None:
        return workload.pp_io  # type: ignore[no-any-return]
    if hf_pipeline.decoder(model) is not None:
        return hf_pipeline.io
    raise ValueError(
        f"workload {workload.name!r}: a pipeline built by your function needs pp_io (batch -> (first "
        "stage's input, target)), which the schedule's step(input, target=...) takes; a Hugging Face "
        "causal LM has one by default"
    )


def call(config: ParityConfig, module: nn.Module, device: torch.device) -> tuple[Built, Found]:
    """The workload's function applied to ``module`` (whole, on ``device``), what it built here,
    and what every stage's units are (gathered from every rank: collective)."""
    workload = registry.get(config.workload)
    whole = {name for name, _ in module.named_parameters(remove_duplicate=False)}
    ties = discover.ties_of(module)
    io = _io(workload, module)
    styles: list[tuple[nn.Module, Any, Any]] = []
    with tensor_parallel.recording_styles(styles):
        result = workload.parallelize(module, candidate.user_mesh(config, device))  # type: ignore[misc]
    schedule, stages = _schedule_of(result, workload.name)
    refused: list[str] = []
    key = _KEYS.get(type(schedule).__name__)
    if key is None:
        refused.append(
            f"{type(schedule).__name__} is not one of torch's schedules the twin mirrors ({', '.join(_KEYS)})"
        )
    loss = schedule._loss_fn or workload.pp_loss
    if loss is None:
        refused.append(
            f"the schedule on rank {dist.get_rank()} has no loss_fn: give every rank's schedule the loss "
            "(loss_fn=...), or declare Workload(pp_loss=...)"
        )
    data_parallel = config.mesh.data_parallel_size(config.world_size)
    mine: list[dict[str, Any]] = []
    for stage in stages:
        inside = {id(m) for m in stage.submod.modules()}  # the styles applied in this stage
        found = discover.read(stage.submod, [s for s in styles if id(s[0]) in inside], data_parallel, [])
        params, buffers = _stage_names(stage)
        mine.append({
            "index": stage.stage_index, "units": found.units, "checkpointed": found.checkpointed,
            "compiled": [c for c in found.compiled if _sendable(c)], "never": found.never_reduced,
            "refused": found.refused + _unsendable(found), "params": params, "buffers": buffers, "tp": found.tp,
            "tp_degree": found.tp_degree, "tp_dim": found.tp_dim,
        })  # fmt: skip
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    merged = _merge([part for rank in every for part in rank], whole, ties, refused)
    built = Built(
        schedule=schedule, stages=stages, key=key or "", microbatches=pipelining.microbatches_of(schedule),
        count=stages[0].num_stages, loss=loss or (lambda *_: torch.zeros(())), io=io,
        names=frozenset(n for part in mine for n in part["params"] + part["buffers"]),
        scale_grads=bool(schedule.scale_grads),
        stage_of={name: part["index"] for rank in every for part in rank for name in part["params"]},
    )  # fmt: skip
    return built, merged


def _merge(
    parts: list[dict[str, Any]], whole: set[str], ties: list[tuple[str, ...]], refused: list[str]
) -> Found:
    """Every stage's facts as one ``Found`` (each stage once: its ``dp`` ranks report it alike)."""
    by_stage: dict[int, dict[str, Any]] = {}
    for part in parts:
        by_stage.setdefault(part["index"], part)
    stages = [by_stage[index] for index in sorted(by_stage)]
    for part in stages:
        refused.extend(part["refused"])
        strange = sorted(set(part["params"]) - whole)
        if strange:
            refused.append(
                f"stage {part['index']} holds {strange[:3]}, which the model as built does not name: keep "
                "the model's names in each stage (a copy of the model with the other stages' modules set to "
                "None, as torchtitan's pipeline_module_split does)"
            )
    held = {name: part["index"] for part in stages for name in part["params"]}
    missing = sorted(name for name in whole if name not in held)
    if missing:
        refused.append(
            f"no stage holds {missing[:3]}{' ...' if len(missing) > 3 else ''}: every parameter of the model "
            "must lie in one stage"
        )
    for tie in ties:
        where = {held.get(name) for name in tie}
        if len(where) > 1:
            refused.append(
                f"the tied parameter {' = '.join(tie)} has a copy in stages {sorted(w for w in where if w is not None)}: "
                "nothing in a parallelize function can sum their gradients across stages; untie it (e.g. "
                "tie_word_embeddings=False) or check the tied model with the built-in pipeline rows (pp_split)"
            )
    units = tuple(unit for part in stages for unit in part["units"])
    if len({unit.policy for unit in units if unit.params}) > 1:
        refused.append(
            "your stages' fully_shard units have different MixedPrecisionPolicy values: a pipeline sums its "
            "microbatches in one dtype in the twin; give the units one policy"
        )
    degrees = {part["tp_degree"] for part in stages if part["tp_degree"] is not None}
    if len(degrees) > 1:
        refused.append(f"your stages apply tensor parallelism of degrees {sorted(degrees)}: one is mirrored")
    return Found(
        units=units,
        tp=tuple(style for part in stages for style in part["tp"]),
        tp_degree=next(iter(degrees), None),
        tp_dim=next((part["tp_dim"] for part in stages if part["tp_dim"] is not None), None),
        checkpointed=tuple(c for part in stages for c in part["checkpointed"]),
        compiled=tuple(c for part in stages for c in part["compiled"]),
        never_reduced=tuple(n for part in stages for n in part["never"]),
        refused=tuple(dict.fromkeys(refused)),
    )


def holds(built: Built) -> Callable[[str], bool]:
    """Whether this rank's stages hold a parameter or buffer of that name (the twin's own_buffers)."""
    return built.names.__contains__
