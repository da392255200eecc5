"""FSDP2 + pipeline parallelism as the candidate (rank side): the model cut into stages
(``stages.py``), each stage ``fully_shard``-ed over its ``dp`` ranks and run by torch's schedule
(``torch.distributed.pipelining``), tied copies summed across the stages.

Why an engine of its own: a pipeline rank holds only its stages, trains a step inside the
schedule (forward, loss and backward of every microbatch, then FSDP's reduction and the division
by the microbatch count: ``PipelineStage.perform_reduce_grad``), and knows its loss only on the
last stage. What the training loop and the step check ask of an engine is answered here for the
whole model: every rank names every parameter (one it does not hold is measured by the stage
that does), the loss travels from the last stage, and full tensors for the record are gathered
within each stage and sent to rank 0.

The scaler scales each microbatch's loss inside the schedule's loss function, where a user's
``scaler.scale(loss)`` goes under PP, and its ``found_inf`` is agreed over every rank (each
stage holds other gradients).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from harness.parity.plan.config import ParityConfig
from harness.parity.plan.config.mesh import SCHEDULES
from harness.parity.ranks.sides import stages as split
from harness.parity.ranks.sides import twin
from harness.parity.ranks.sides.engines import FSDP2, Engine, to_device, unit_modules
from harness.parity.ranks.sides.full import gather
from harness.parity.ranks.sides.pipeline import halves
from harness.parity.ranks.wire import FunctionFacts
from harness.parity.workload import tp_plan


class PipelineFSDP2(FSDP2):
    """The stages of this rank, ``fully_shard``-ed over ``dp``, under the configuration's schedule."""

    compares_own_shards = True

    def __init__(self, config: ParityConfig, device: torch.device) -> None:
        Engine.__init__(self, config, device)
        mesh = config.mesh
        tp = f" x tp {mesh.tp}" if mesh.tp is not None else ""
        self.description = (
            f"FSDP2 + PP (pp {mesh.pp} x dp {self.data_parallel_size}{tp}, torch's "
            f"{SCHEDULES[mesh.schedule][0]}, {mesh.microbatches} microbatches, stages {list(self.cut.stages)} "
            f"of {self.cut.count} here), reshard_after_forward={config.layout.reshard_after_forward}, "
            f"{config.recipe_name}" + (f"; each stage's part of the plan: {self.plan_text}" if tp else "")
        )
        if self.ties:
            self.facts = FunctionFacts(stage_ties=tuple(self.ties))

    # -- building ---------------------------------------------------------------------------------
    def wrap(self, module: nn.Module) -> nn.Module:
        from torch.distributed import pipelining
        from torch.distributed.fsdp import fully_shard

        config, mesh = self.config, self.config.mesh
        grid = gather.mesh(self.device.type, *mesh.shape(self.world_size))  # type: ignore[misc]
        self.pp_group = grid.get_group("pp")
        self.pp_rank = grid.get_local_rank("pp")
        tp_rank = grid.get_local_rank("tp") if mesh.tp is not None else 0
        self.stage_owner = (tp_rank == 0, tp_rank == 0 and self.data_rank == 0)
        """This rank's say over its stage's tensors (``measure/local.py``): its shards where its TP
        coordinate is 0 (the TP ranks of a dp coordinate hold the same shards of what TP does not
        split), whole tensors on the stage's first rank."""
        plan = tp_plan.resolve(self.workload, module) if mesh.tp is not None else None
        self.plan_text = ""
        if plan is not None:
            tp_plan.check_degree(self.workload, module, mesh.tp)
            self.plan_text = ", ".join(f"{key} {type(style).__name__}" for key, style in plan.items())
        self.name_whole(module)
        self.cut = split.of_rank(self.workload, module, mesh, self.pp_rank)
        self.io, self.loss = split.io_and_loss(self.workload, module)
        kwargs: dict[str, Any] = {
            "mesh": grid["dp"],
            "reshard_after_forward": config.layout.reshard_after_forward,
        }
        if config.policy is not None:
            kwargs["mp_policy"] = twin.fsdp2_mixed_precision(config.policy)
        self.stage_modules: list[nn.Module] = []
        stages = []
        for position, (index, kept) in enumerate(zip(self.cut.stages, self.cut.items, strict=True)):
            last = (
                position == len(self.cut.stages) - 1
            )  # the earlier stages copied first, the last cut in place
            stage = split.cut(module, list(kept), in_place=last)
            if plan is not None:
                _parallelize(stage, grid["tp"], plan)
            for unit in reversed(unit_modules(stage, self.units)):  # innermost first
                fully_shard(unit, **kwargs)
            fully_shard(stage, **kwargs)
            self.stage_modules.append(stage)
            stages.append(
                pipelining.PipelineStage(stage, index, self.cut.count, self.device, group=self.pp_group)
            )
        self.schedule_key, self.microbatches = mesh.schedule, mesh.microbatches
        schedule = getattr(pipelining, SCHEDULES[mesh.schedule][0])
        self.schedule = schedule(
            stages if SCHEDULES[mesh.schedule][1] > 1 else stages[0],
            n_microbatches=mesh.microbatches,
            loss_fn=self._loss_fn,
            scale_grads=True,
        )
        self._check_order()
        self._check_halves()
        self._scaler: Any = None
        self._losses: list[float] = []
        return self.stage_modules[0]

    def name_whole(self, module: nn.Module) -> None:
        """Every parameter of the whole model, before any cut: a rank names each, held or not."""
        self.whole_meta = {name: (tuple(p.shape), p.dtype) for name, p in module.named_parameters()}
        self.whole_order = list(self.whole_meta)

    def _check_order(self) -> None:
        """Refuse a schedule whose stages add their microbatches' weight gradients in another order
        than the twin back-propagates them (``split.backward_order``), read from torch's own
        ``pipeline_order`` where the schedule has one: a new torch's schedule then errs, naming
        both orders, instead of failing its rows by rounding."""
        order = getattr(self.schedule, "pipeline_order", None)
        if not order:
            return
        wanted = split.backward_order(self.schedule_key, self.microbatches)
        for stage in self.cut.stages:
            found = split.weight_order(order[self.pp_rank], stage)
            if found != wanted:
                raise RuntimeError(
                    f"{type(self.schedule).__name__} adds stage {stage}'s weight gradients in microbatch "
                    f"order {found}; the twin back-propagates them in {wanted} (split.backward_order)"
                )

    def _check_halves(self) -> None:
        """Refuse a schedule whose plan moves a stage's split-backward sums into the reduce dtype
        after other microbatches than the twin's plan over stand-in stages (``halves.built_in``)."""
        order = getattr(self.schedule, "pipeline_order", None)
        if not order:
            return
        mesh = self.config.mesh
        planned = halves.planned(self.schedule_key, mesh.pp, self.microbatches, split.held_stages(mesh, 0))
        for stage in self.cut.stages:
            found = halves.moved_after(order, stage)
            wanted = None if planned is None else halves.moved_after(planned, stage)
            if found != wanted:
                raise RuntimeError(
                    f"{type(self.schedule).__name__} moves stage {stage}'s summed weight gradients into the "
                    f"reduce dtype after microbatches {sorted(found)}; the twin, planning the schedule over "
                    f"stand-in stages, after {None if wanted is None else sorted(wanted)} (halves.planned)"
                )

    def _loss_fn(self, output: torch.Tensor, target: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """One microbatch's loss as the schedule back-propagates it: scaled, as the user's
        ``scaler.scale(loss)``; its unscaled value kept for the record (the schedule's first step
        also calls it once on its shape-inference forward: only the last ``microbatches`` count)."""
        loss = self.loss(output, target, **kwargs)
        self._losses.append(loss.item())
        return self._scaler.scale(loss)

    def named_trainable(self) -> list[tuple[str, torch.Tensor]]:
        return [(n, p) for n, p in self.named_parameters_whole() if p.requires_grad]

    def named_parameters_whole(self) -> list[tuple[str, torch.Tensor]]:
        return [
            (gather.clean_name(n), p) for stage in self.stage_modules for n, p in stage.named_parameters()
        ]

    def own_buffers(self) -> dict[str, torch.Tensor]:
        return {
            gather.clean_name(n): gather.to_cpu(b)
            for stage in self.stage_modules
            for n, b in stage.named_buffers()
        }

    def staged_refusal(self) -> str | None:
        return "the staged check does not judge pipeline rows (their reference mirrors the stages)"

    # -- one step ---------------------------------------------------------------------------------
    def forward_backward(self, step: int, scaler: Any) -> float:
        """Every microbatch through the schedule (its backward, FSDP's reduction and the division
        by the count included), the tied copies summed; the mean of the microbatches' losses,
        sent from the last stage to every rank of the pipeline."""
        self._scaler, self._losses = scaler, []
        # A stage without the loss never calls scale(), and a scaler steps only once its scale
        # exists (torch's and ours): every rank scales a zero first, as a PP training loop must.
        scaler.scale(torch.zeros((), device=self.device))
        batch = to_device(self.finish(self.batch(step, self.data_rank), scaler.get_scale()), self.device)
        inputs, target = self.io(batch)
        split.split_microbatches(inputs, self.microbatches)  # refused as the twin refuses
        first = 0 in self.cut.stages
        last = self.cut.count - 1 in self.cut.stages
        with self.forward_rng(step):
            self.schedule.step(*((inputs,) if first else ()), target=target if last else None)
        sum_ties(self, self.pp_group)
        values = self._losses[-self.microbatches :]
        mean = torch.tensor(
            [sum(values) / len(values) if last else 0.0], dtype=torch.float64, device=self.device
        )
        dist.all_reduce(mean, group=self.pp_group)  # one stage holds it, the others add zeros
        return float(mean.item())

    # -- tensors for the record ---------------------------------------------------------------------
    def full_grads(self, copy: bool = True) -> dict[str, torch.Tensor]:  # gathered: new tensors
        grads = {
            n: p.grad if p.grad is not None else gather.zeros_like_shards(p)
            for n, p in self.named_trainable()
        }
        return self._on_rank_zero(gather.full_tensors(grads, self.device))

    def full_after_step(
        self, optimizers: list[torch.optim.Optimizer], *, copy: bool = True
    ) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
        element_keys, scalar_keys = gather.state_keys(optimizers)
        state = {id(p): values for opt in optimizers for p, values in opt.state.items()}
        wanted: dict[tuple[str, ...], Any] = {("param", n): p for n, p in self.named_parameters_whole()}
        for name, param in self.named_trainable():
            values = state.get(id(param), {})
            if not values:
                continue
            for key in element_keys:
                wanted[("state", name, key)] = values.get(key, gather.zeros_like_shards(param))
            for key in scalar_keys:
                wanted[("state", name, key)] = values.get(key, torch.zeros(()))
        found = self._on_rank_zero(gather.full_tensors(wanted, self.device))
        params = {key[1]: value for key, value in found.items() if key[0] == "param"}
        full: dict[str, dict[str, torch.Tensor]] = {}
        for key, value in found.items():
            if key[0] == "state":
                full.setdefault(key[1], {})[key[2]] = value
        return params, full

    def _on_rank_zero(self, found: dict[Any, torch.Tensor]) -> dict[Any, torch.Tensor]:
        """Each stage's full tensors (every rank of a stage holds them once gathered) sent to
        rank 0 by the stage's first ``dp`` rank (collective over every rank); ``{}`` elsewhere."""
        mine = found if self.stage_owner[1] else {}
        every: list[Any] = [None] * self.world_size if self.rank == 0 else []
        dist.gather_object(mine, every if self.rank == 0 else None, dst=0)
        if self.rank != 0:
            return {}
        merged: dict[Any, torch.Tensor] = {}
        for part in every:
            merged.update(part)
        return merged


def _parallelize(stage: nn.Module, tp_mesh: Any, plan: dict[str, Any]) -> None:
    """The workload's TP plan applied to the modules ``stage`` holds (a Hugging Face stage's model
    inside it): the plan's keys are the whole model's, and those naming modules of other stages
    are left out, as a user parallelizing each stage would."""
    from torch.distributed.tensor.parallel import parallelize_module

    from harness.parity.workload import hf_pipeline

    target = getattr(stage, hf_pipeline.WRAPPER, stage)
    held = {key: style for key, style in plan.items() if tp_plan.styled_modules({key: style}, target)}
    parallelize_module(target, tp_mesh, held)


def sum_ties(engine: Any, group: Any) -> None:
    """Each tied parameter's gradient summed over its copies on every stage (an all-reduce over
    the pipeline group: a stage without a copy adds zeros), written into every copy: the
    copies then step alike, as the one parameter of the unsharded model would."""
    held = dict(engine.named_trainable())
    for tie in engine.ties:
        copies = [held[name] for name in tie if name in held]
        shape = engine.whole_meta[tie[0]][0]
        local = [
            Engine.local(p.grad) if p.grad is not None else Engine.local(gather.zeros_like_shards(p))
            for p in copies
        ]
        if local:
            total = local[0].clone()
            for more in local[1:]:
                total += more
        else:  # no copy here: zeros shaped like a copy's shard (every copy is sharded alike)
            total = torch.zeros(_shard_shape(shape, engine), dtype=torch.float32, device=engine.device)
        dist.all_reduce(total, group=group)
        for param in copies:
            if param.grad is None:
                param.grad = gather.shard_like(total.clone(), param)
            else:
                Engine.local(param.grad).copy_(total)


def _shard_shape(shape: tuple[int, ...], engine: Any) -> tuple[int, ...]:
    """This rank's ``Shard(0)`` rows of a parameter of ``shape`` over its stage's ``dp`` ranks."""
    dp = engine.config.mesh.data_parallel_size(engine.world_size)
    chunk = -(-shape[0] // dp)
    rows = max(0, min(chunk, shape[0] - engine.data_rank * chunk))
    return (rows, *shape[1:])
