"""Build the model a run trains (rank side): DDP, DDP in low precision, FSDP1, FSDP2 or one process.

Why an engine object: the training loop (``train.py``) is the same for the reference and the
candidate; what differs is how the model is wrapped, what a rank's loss is, what happens after
``backward`` (the low-precision DDP reference copies gradients into float32 master weights), how
gradients are clipped, and how full tensors are gathered for the record. Each engine answers those
questions and nothing else. Every engine builds its model from the configuration's seed, so the
reference and the candidate start from the same weights on every rank.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from harness.parity.plan.config import ParityConfig
from harness.parity.plan.precision import PrecisionPolicy
from harness.parity.ranks.sides import reduce_layout, twin
from harness.parity.ranks.sides import stages as pipeline_split
from harness.parity.ranks.sides.full import flat, gather
from harness.parity.ranks.sides.optim.optimizers import make_optimizer
from harness.parity.ranks.wire import FunctionFacts
from harness.parity.workload import items, registry, units
from harness.parity.workload.batches import to_device


def unit_modules(module: nn.Module, classes: tuple[type[nn.Module], ...]) -> list[nn.Module]:
    """The modules FSDP wraps below the root: every instance of a unit class, in module order."""
    return [m for m in module.modules() if classes and isinstance(m, classes) and m is not module]


class Engine:
    """A wrapped model and the questions the training loop asks of it (the DDP behaviour here)."""

    description = "DDP"

    def __init__(self, config: ParityConfig, device: torch.device) -> None:
        self.config = config
        self.device = device
        self.workload = registry.get(config.workload)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.data_rank = config.mesh.data_rank(self.rank, self.world_size)
        """Whose batch this rank trains (under TP, its data-parallel group's; ``plan/config/mesh.py``)."""
        model = registry.build_model(self.workload, config.seed)
        self.ties = pipeline_split.untie(model) if config.mesh.pp is not None else []
        """A pipeline's tied parameters, untied on both sides (``stages.untie``)."""
        if self.workload.sparse:  # sparse workloads train in their precision throughout
            model = model.to(twin.DTYPES[config.precision.dtype])
        self.module = model.to(device)
        self.units = units.resolve(self.workload, model)
        """The FSDP unit classes (the workload's, or resolved from ``_no_split_modules``)."""
        self.first_unit = self._first_unit_prefix()  # before wrapping: FSDP1 renames submodules
        self.wrapped = self.wrap(self.module)

    # -- building ---------------------------------------------------------------------------------
    def wrap(self, module: nn.Module) -> nn.Module:
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DDP(module, device_ids=device_ids)

    def named_trainable(self) -> list[tuple[str, torch.Tensor]]:
        """``(name, parameter)`` the optimizers own, names as in the unwrapped model."""
        return [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]

    def named_parameters_whole(self) -> list[tuple[str, torch.Tensor]]:
        """Every ``(name, parameter)``, names as in the unwrapped model (a user's function may
        insert wrappers: ``user/candidate.py``)."""
        return list(self.module.named_parameters())

    def param_groups(self, optimizers: int) -> list[list[torch.Tensor]]:
        """The parameters of each optimizer: all of them, or split into the first unit's and the
        rest. The first unit is the first module of a ``units`` class, in module order, that holds
        trainable parameters (for a workload without units, the first such submodule)."""
        named = self.named_trainable()
        if optimizers == 1:
            return [[p for _, p in named]]
        prefix = self.first_unit or "\0"  # no unit: nothing is inside it, refused below
        first = [p for n, p in named if n.startswith(prefix)]
        rest = [p for n, p in named if not n.startswith(prefix)]
        if not first or not rest:
            raise ValueError(
                f"two optimizers need trainable parameters inside and outside the first unit {prefix!r} "
                f"of workload {self.workload.name!r}"
            )
        return [first, rest]

    def _first_unit_prefix(self) -> str | None:
        wanted = self.units or (nn.Module,)
        for name, module in self.module.named_modules():
            if name and isinstance(module, wanted) and any(p.requires_grad for p in module.parameters()):
                return name + "."
        return None

    def make_optimizer(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        """The configuration's optimizer over ``params`` (``own``: the workload's)."""
        if self.config.optimizer == "own":
            if self.workload.optimizer is None:
                raise ValueError(f"optimizer='own' but workload {self.workload.name!r} defines none")
            return self.workload.optimizer(params)
        return make_optimizer(self.config.optimizer, params)

    # -- one step ---------------------------------------------------------------------------------
    def batch(self, step: int, rank: int) -> Any:
        return registry.make_batch(self.workload, self.config.seed, rank, step)

    carried_rng: Callable[[int], AbstractContextManager[Any]] | None = None
    """A resume row's forward RNG policy (``loop_state.CarriedRng.around``, set by the run's
    ``LoopState.start``): torch's RNG carried on from step to step instead of seeded per step."""

    def forward_rng(self, step: int) -> Any:
        """torch's RNG seeded for this rank's forward of ``step`` (dropout masks match the
        reference's: no engine draws from it between here and the model's own draws), or carried
        on from the previous step's on a resume row (:attr:`carried_rng`)."""
        if self.carried_rng is not None:
            return self.carried_rng(step)
        return registry.seeded(registry.forward_seed(self.config.seed, self.data_rank, step), self.device)

    def autocast(self) -> Any:
        """The recipe's ``torch.autocast`` around the forward (``autocast``/``mixed`` recipes), on
        the reference as on the candidate; a no-op otherwise. The backward needs none: autograd
        runs each op's backward in the dtypes its forward chose."""
        if self.config.precision.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=twin.DTYPES[self.config.precision.autocast])

    def finish(self, batch: Any, scale: float) -> Any:
        if self.workload.finish_batch is None:
            return batch
        return self.workload.finish_batch(batch, twin.DTYPES[self.config.precision.dtype], scale)

    compares_own_shards = False
    """A pipeline's candidate: each stage compares its own shards (``measure/local.py``)."""

    def forward_backward(self, step: int, scaler: Any) -> float:
        """One step's forward and scaled backward; this rank's loss as recorded (a pipeline runs
        its schedule instead: ``pipeline/``)."""
        loss, recorded = self.losses(step, scaler.get_scale())
        scaler.scale(loss).backward()
        return recorded

    def losses(self, step: int, scale: float) -> tuple[torch.Tensor, float]:
        """``(loss to back-propagate, this rank's loss as recorded)``."""
        batch = to_device(self.finish(self.batch(step, self.data_rank), scale), self.device)
        with self.forward_rng(step), self.autocast():
            loss = self.loss_of(self.wrapped, batch, step)
        return loss, loss.item()

    def loss_of(self, model: nn.Module, batch: Any, step: int) -> torch.Tensor:
        """The workload's loss on ``batch`` (batch index ``step``); a loss that takes ``num_items``
        gets the whole step's count and is scaled as its share (``workload/items.py``)."""
        if not self.workload.takes_num_items:
            return self.workload.loss(model, batch)
        share = self.workload.loss_of(model, batch, self.num_items(step))
        return share * items.share_factor(self.data_parallel_size, self.config.loop.accumulate)

    @property
    def data_parallel_size(self) -> int:
        """Over how many ranks the gradients are averaged (the world, or under TP its ``dp`` size)."""
        return self.config.mesh.data_parallel_size(self.config.world_size)

    def num_items(self, step: int) -> int:
        """The items of the optimizer step that trains on batch ``step`` (``workload/items.py``)."""
        config = self.config
        return items.global_count(
            config.workload, config.seed, self.data_parallel_size, config.loop.accumulate, step
        )

    recorded_checkpoint: str | None = None
    """What a step records of activation checkpointing when the engine, not the configuration,
    knows it (a user's function: ``replay``/``no_replay``, ``user/``); ``None``: the configuration's."""
    compile_backend: str | None = None
    """The backend a step records for compiled modules when the engine knows it (a user's function)."""
    compiled_count: int | None = None
    """How many modules run compiled when the engine knows it better than its trained module's
    ``_compiled_call_impl`` (a user's ``torch.compile(module)`` wraps instead)."""
    units_reduce_dtypes: dict[str, torch.dtype] | None = None
    """Per parameter, the dtype the candidate's units sum its gradient in, when the engine knows it
    and the configuration does not (a user's function's policies); the staged check bounds each
    sum in it."""

    def staged_refusal(self) -> str | None:
        """Why the staged check cannot judge this candidate, known only once it is built (``None``:
        it can)."""
        return None

    reduces_itself = False
    """A reference whose own reducer is its candidate's (the DDP twin of a user's function that wraps
    the root in DDP): it accumulates microbatches as its candidate does, not by hand."""
    facts: FunctionFacts | None = None
    """What a user's function did that explains a difference by itself (``user/candidate.py``)."""

    def running_policy(self) -> PrecisionPolicy | None:
        """The mixed precision this side runs in: the configuration's (a user's function: its
        units', read on the ranks)."""
        return self.config.policy

    unscales_first = False
    """Whether the loop must call ``unscale_`` itself so that :meth:`before_step` sees unscaled grads."""

    summed_in_reverse = False
    """A reference that reduces by hand (``references.py``, ``accumulate.HandAccumulation``): its
    reductions sum the ranks in reverse rank order instead of through the candidate's collective
    (``reduce_layout.reduce(in_reverse=True)``). Only the drift's second reference sets it
    (``train.Run(summed_in_reverse=True)``, ``ranks/drift.py``)."""

    def after_backward(self) -> None:
        """Called between ``backward`` and the scaler (gradients are final afterwards)."""

    def before_step(self) -> None:
        """Called after ``unscale_`` (when the loop unscales first), before ``step``."""

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Clip the unscaled gradients to ``max_norm``; the total norm the clip measured (FSDP2's
        over DTensors comes back replicated: read as a plain tensor)."""
        norm = torch.nn.utils.clip_grad_norm_([p for _, p in self.named_trainable()], max_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    # -- tensors ------------------------------------------------------------------------------------
    @staticmethod
    def local(tensor: torch.Tensor) -> torch.Tensor:
        """This rank's elements of ``tensor`` (the local shard of a DTensor)."""
        return tensor.to_local() if hasattr(tensor, "to_local") else tensor

    def full_grads(self, copy: bool = True) -> dict[str, torch.Tensor]:
        """Every gradient whole, by name (collective where sharded). ``copy=False``: a caller that
        divides them at once into new tensors gets a whole-held gradient itself, not a copy."""
        held = gather.to_cpu if copy else gather.whole
        return {n: held(p.grad) for n, p in self.named_trainable() if p.grad is not None}

    def observed(self, module: str, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (an output of ``module``, or its gradient) as the unsharded model holds it, for
        the localization's probes (tensor parallelism hands on a rank's share: gathered there)."""
        return tensor

    def trained_module(self) -> nn.Module:
        """The module whose forward runs (the low-precision reference runs a working copy)."""
        return self.module

    def candidate_layout(self) -> reduce_layout.Layout:
        """How the candidate of this configuration lays out and reduces its gradients, over
        :meth:`trained_module` (the reference's hand reductions follow it)."""
        model = self.trained_module()
        compute = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        return reduce_layout.of(self.config, model, unit_modules(model, self.units), compute)

    def own_buffers(self) -> dict[str, torch.Tensor]:
        """This rank's module buffers by name as in the unwrapped model (never sharded, so local;
        not collective)."""
        return {gather.clean_name(n): gather.to_cpu(b) for n, b in self.trained_module().named_buffers()}

    def full_after_step(
        self, optimizers: list[torch.optim.Optimizer], *, copy: bool = True
    ) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
        """``(full parameters, full optimizer state by name then key)``; collective for sharded
        engines, which gather both in one go (copies always). ``copy=False``: the live tensors
        where whole and on the CPU (``gather.whole``: a lockstep reference's, read before it trains on)."""
        take = gather.to_cpu if copy else gather.whole
        params = {n: take(p) for n, p in self.named_parameters_whole()}
        names = {id(p): n for n, p in self.named_trainable()}
        state = {
            names[id(p)]: {key: take(value) for key, value in values.items()}
            for opt in optimizers
            for p, values in opt.state.items()
            if values
        }
        return params, state


class FSDP1(Engine):
    """``FullyShardedDataParallel`` with the configuration's strategy, units, precision and offload."""

    def __init__(self, config: ParityConfig, device: torch.device) -> None:
        super().__init__(config, device)
        self.description = (
            f"FSDP1 {config.layout.sharding}, use_orig_params={config.layout.use_orig_params}, {config.recipe_name}"
            + (", CPUOffload" if config.layout.offload else "")
        )

    def wrap(self, module: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import CPUOffload, ShardingStrategy
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        config = self.config
        kwargs: dict[str, Any] = {
            "device_id": self.device,
            "sharding_strategy": ShardingStrategy[config.layout.sharding.upper()],  # type: ignore[union-attr]
            "use_orig_params": config.layout.use_orig_params,
        }
        if self.units:
            kwargs["auto_wrap_policy"] = ModuleWrapPolicy(set(self.units))
        if config.policy is not None:
            kwargs["mixed_precision"] = twin.fsdp1_mixed_precision(config.policy)
        if config.layout.offload:
            kwargs["cpu_offload"] = CPUOffload(offload_params=True)
        if config.layout.sharding == "hybrid_shard":
            kwargs["device_mesh"] = gather.mesh(
                self.device.type, (self.world_size // 2, 2), ("replicate", "shard")
            )
        return FSDP(module, **kwargs)

    def named_trainable(self) -> list[tuple[str, torch.Tensor]]:
        return [(gather.clean_name(n), p) for n, p in self.wrapped.named_parameters() if p.requires_grad]

    def clip_grad_norm_(self, max_norm: float) -> float:
        return float(self.wrapped.clip_grad_norm_(max_norm))  # type: ignore[operator]

    def full_grads(self, copy: bool = True) -> dict[str, torch.Tensor]:
        return flat.full_grads(self.wrapped, self.device)  # gathered: new tensors either way

    def full_after_step(
        self, optimizers: list[torch.optim.Optimizer], *, copy: bool = True
    ) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
        return flat.full_params_and_state(self.wrapped, optimizers, self.device)


class FSDP2(Engine):
    """``fully_shard`` on every unit and the root, with the configuration's precision and offload
    (HSDP: on a 2-D mesh, replicate x shard)."""

    def __init__(self, config: ParityConfig, device: torch.device) -> None:
        super().__init__(config, device)
        self.description = (
            f"FSDP2 fully_shard, reshard_after_forward={config.layout.reshard_after_forward}, {config.recipe_name}"
            + (", CPUOffloadPolicy" if config.layout.offload else "")
            + (
                f", HSDP mesh {' x '.join(config.mesh.id_parts(config.world_size))}"
                if config.mesh.hsdp is not None
                else ""
            )
        )

    def wrap(self, module: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

        config = self.config
        shape = config.mesh.shape(config.world_size)  # HSDP: (replicate, shard); else one dimension
        kwargs: dict[str, Any] = {
            "mesh": gather.mesh(self.device.type, *shape)
            if shape is not None
            else gather.mesh(self.device.type, (self.world_size,), None),
            "reshard_after_forward": config.layout.reshard_after_forward,
        }
        if config.policy is not None:
            kwargs["mp_policy"] = twin.fsdp2_mixed_precision(config.policy)
        if config.layout.offload:
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
        for unit in reversed(unit_modules(module, self.units)):  # innermost first
            fully_shard(unit, **kwargs)
        fully_shard(module, **kwargs)
        return module

    def full_grads(self, copy: bool = True) -> dict[str, torch.Tensor]:
        """Full gradients of the parameters that have one on any rank (agreed first: a rank
        without a gradient sends zeros, so every rank gathers the same tensors): new tensors."""
        trainable = self.named_trainable()
        held = gather.anywhere([p.grad is not None for _, p in trainable], self.device)
        grads = {
            n: p.grad if p.grad is not None else gather.zeros_like_shards(p)
            for (n, p), anywhere in zip(trainable, held, strict=True)
            if anywhere
        }
        return gather.full_tensors(grads, self.device)

    def full_after_step(
        self, optimizers: list[torch.optim.Optimizer], *, copy: bool = True
    ) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
        """Parameters and optimizer state in one batched gather. Every rank sends the same entries
        even when the ranks' states differ (a rank that skipped the step the others took has no
        state yet): a missing per-element entry travels as zeros shaped like the parameter's
        shard (``gather.zeros_like_shards``, which states the global shape and stride), and one
        all-reduce says which parameters have state on any rank."""
        element_keys, scalar_keys = gather.state_keys(optimizers)
        state = {id(p): values for opt in optimizers for p, values in opt.state.items()}
        trainable = self.named_trainable()
        wanted: dict[tuple[str, ...], Any] = {("param", n): p for n, p in self.named_parameters_whole()}
        for name, param in trainable:
            values = state.get(id(param), {})
            for key in element_keys:
                value = values.get(key)
                wanted[("state", name, key)] = value if value is not None else gather.zeros_like_shards(param)
            for key in scalar_keys:
                wanted[("state", name, key)] = values.get(key, torch.zeros(()))
        present = gather.anywhere([bool(state.get(id(p))) for _, p in trainable], self.device)
        with_state = {name for (name, _), flag in zip(trainable, present, strict=True) if flag}
        params: dict[str, torch.Tensor] = {}
        full: dict[str, dict[str, torch.Tensor]] = {}
        for key, value in gather.full_tensors(wanted, self.device).items():
            if key[0] == "param":
                params[key[1]] = value
            elif key[1] in with_state:
                full.setdefault(key[1], {})[key[2]] = value
        return params, full
