"""The references (rank side): the unsharded twins a candidate is compared with.

Why apart from ``engines.py``: each is an :class:`~harness.parity.ranks.sides.engines.Engine` that
answers the training loop's questions as its candidate's twin would: the low-precision twin of a
mixed-precision policy (float32 masters, the policy emulated field by field), the float32 twin of
an FSDP candidate (DDP's forward, the gradients reduced as the candidate reduces them), and the
single process over every rank's batch (sparse gradients). ``roles.build`` picks one.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from harness.parity.plan.config import ParityConfig, resume
from harness.parity.plan.precision import PrecisionPolicy
from harness.parity.ranks.sides import reduce_layout, twin
from harness.parity.ranks.sides.engines import Engine, to_device, unit_modules
from harness.parity.ranks.sides.optim import step_pieces
from harness.parity.ranks.sides.two_ranks import shared_pair
from harness.parity.workload import items
from harness.torch_private import ddp, tensors


def forward_only_ddp(module: nn.Module, device: torch.device, compiled: bool) -> nn.Module:
    """DDP for a reference that reduces its gradients by hand: DDP's forward as it is (buffers
    broadcast from rank 0 before it, ``no_sync`` for the backward), but with one parameter in its
    reducer's buckets instead of all: the buckets hold a copy of every gradient, memory the size of
    the model that a hand reduction never uses. The parameters DDP is told to ignore are broadcast
    from rank 0 here, as DDP broadcasts the ones it keeps. A ``compiled`` model keeps every
    parameter in DDP's buckets: dynamo splits a graph compiled under DDP at its bucket boundaries."""
    device_ids = [device.index] if device.type == "cuda" else None
    trainable = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    if compiled or len(trainable) < 2:
        return DDP(module, device_ids=device_ids)
    kept = min(trainable, key=lambda item: item[1].numel())[0]
    ignored = [name for name, _ in trainable if name != kept]
    ddp.ignore_for_model(module, ignored)
    wrapped = DDP(module, device_ids=device_ids)
    if dist.get_world_size() > 1:  # one broadcast of them all, as DDP's own is coalesced
        params = [param.detach() for name, param in trainable if name != kept]
        flat = tensors.flatten_dense(params)
        shared_pair.broadcast(flat, 0)  # 2 ranks on one host: through memory they share
        with torch.no_grad():
            for param, value in zip(params, tensors.unflatten_dense(flat, params), strict=True):
                param.copy_(value)
    return wrapped


class LowPrecisionDDP(Engine):
    """The mixed-precision reference: the candidate's unsharded twin, float32 master weights.

    Why not DDP's own ``mixed_precision``: it needs device events, which the CPU backend lacks, and
    it knows nothing of FSDP's buffer, input and output semantics. This trains a working copy made
    from the candidate's own :class:`~harness.parity.plan.precision.PrecisionPolicy`
    (``config.policy``, emulated by ``twin.py`` field by field: parameter dtype, buffers cast or
    kept, inputs cast at the root or at every unit, output casts), under DDP for the forward (the
    fp32 reference's path) but with its gradients reduced by hand in the policy's reduce dtype and
    handed to an optimizer over the float32 masters.
    """

    def __init__(self, config: ParityConfig, device: torch.device) -> None:
        policy = self.candidate_policy(config)
        assert policy is not None, "a low-precision reference needs a mixed-precision policy"
        self.policy = policy
        self.dtype = twin.DTYPES[policy.param]
        super().__init__(config, device)
        self.description = (
            f"DDP, {config.precision.dtype} working copy with float32 master weights ({policy})"
        )

    @staticmethod
    def candidate_policy(config: ParityConfig) -> PrecisionPolicy | None:
        """The policy to emulate: the candidate's, whatever its engine."""
        return config.policy

    def wrap(self, module: nn.Module) -> nn.Module:
        self.working = twin.working_copy(module, self.policy)
        twin.install_casts(self.working, unit_modules(self.working, self.units), self.policy)
        self.layout = self.candidate_layout()  # over the working copy: its compute dtype aligns FSDP1
        return forward_only_ddp(self.working, self.device, self.config.compile.mode is not None)

    def trained_module(self) -> nn.Module:
        return self.working

    def make_optimizer(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        """The optimizer over the float32 masters; a fused one steps the candidate's shards of them
        (``step_pieces.py``: its kernel rounds an element by its offset in the tensor it is given)."""
        masters = list(self.module.parameters())
        return step_pieces.mirror(
            super().make_optimizer(params), masters, lambda: self.layout, self.world_size
        )

    def losses(self, step: int, scale: float) -> tuple[torch.Tensor, float]:
        with torch.no_grad():
            for low, master in zip(self.working.parameters(), self.module.parameters(), strict=True):
                low.copy_(master)
        batch = to_device(self.batch(step, self.data_rank), self.device)
        with self.forward_rng(step), self.autocast(), self.wrapped.no_sync():  # type: ignore[operator]
            loss = self.loss_of(self.wrapped, batch, step)  # reduced by hand in after_backward
        return loss, loss.item()

    def after_backward(self) -> None:
        factors = twin.divide_factors(
            self.config.engine,
            twin.DTYPES[self.policy.reduce_dtype],
            self.config.mesh.data_parallel_size(self.config.world_size),
        )
        twin.reduce_grads(
            list(self.working.parameters()),
            list(self.module.parameters()),
            self.policy,
            factors,
            self.layout,
            in_reverse=self.summed_in_reverse,
        )


class MirroredDDP(Engine):
    """The float32 reference of an FSDP candidate: DDP's forward, the gradients reduced by hand
    through the candidate's collectives on its buffer layout (``reduce_layout.py``) with its divide
    factors (``twin.divide_factors``), so that every element is summed in the candidate's order.

    Why not DDP's own reducer: its buckets put each element at another offset of another buffer
    than FSDP's, and from 3 ranks on the ring then sums it in another order (2 ranks: any order
    gives the same bits, and this gives DDP's). A resume row whose candidate comes back in another
    layout (``Resume.layout``) is mirrored in each: its own layout before
    ``resume_at``, the one it resumes in from there (a DDP phase reduces through DDP's own
    reducer, as its candidate does)."""

    def __init__(self, config: ParityConfig, device: torch.device) -> None:
        super().__init__(config, device)
        self.phases = [(0, config.engine, self._layout_of(config))]
        """``(first step, engine, layout or None: DDP's own reducer)`` in step order."""
        if config.resume.layout is not None:
            resumed = resume.into(config)
            self.phases.append((config.resume.at, resumed.engine, self._layout_of(resumed)))
        engines = " then ".join(engine.upper() for _, engine, _ in self.phases)
        self.description = f"DDP, gradients reduced as {engines} reduces them"
        self.layout = self.phases[0][2]
        self._phase = self.phases[0]

    def wrap(self, module: nn.Module) -> nn.Module:
        """DDP's reducer buckets only what it reduces: nothing, unless a phase is DDP's own."""
        config = self.config
        engines = [config.engine] + ([resume.into(config).engine] if config.resume.layout is not None else [])
        if "ddp" in engines:
            return super().wrap(module)
        return forward_only_ddp(module, self.device, config.compile.mode is not None)

    def _layout_of(self, config: ParityConfig) -> reduce_layout.Layout | None:
        if config.engine == "ddp":
            return None
        model = self.trained_module()
        return reduce_layout.of(config, model, unit_modules(model, self.units), torch.float32)

    def make_optimizer(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        """The configuration's optimizer; a fused one steps the candidate's shards of the
        parameters, in the layout of the current phase (``step_pieces.py``: its kernel rounds an
        element by its offset in the tensor it is given)."""
        model = list(self.module.parameters())
        return step_pieces.mirror(
            super().make_optimizer(params), model, lambda: self._phase[2], self.world_size
        )

    def losses(self, step: int, scale: float) -> tuple[torch.Tensor, float]:
        self._phase = [phase for phase in self.phases if phase[0] <= step][-1]
        if self._phase[2] is None:  # DDP's own reducer, syncing in backward
            return super().losses(step, scale)
        with self.wrapped.no_sync():  # type: ignore[operator]
            return super().losses(step, scale)

    def after_backward(self) -> None:
        _, engine, layout = self._phase
        if layout is None:
            return
        params = list(self.module.parameters())
        grads: list[torch.Tensor | None] = [p.grad for p in params]
        if all(g is None for g in grads):
            return
        factors = twin.divide_factors(
            engine, torch.float32, self.config.mesh.data_parallel_size(self.config.world_size)
        )
        for param in params:  # the list holds them now, and lets each go once it is reduced
            param.grad = None
        reduced = reduce_layout.reduce(
            layout, params, grads, torch.float32, factors, in_reverse=self.summed_in_reverse, consume=True
        )
        for param, grad in zip(params, reduced, strict=True):
            param.grad = None if grad is None else grad.to(param.dtype)


class SingleProcess(Engine):
    """The sparse reference: one unwrapped model trained on every rank's batch at once.

    Every rank computes the same thing (so the scaler's agreement is trivially consistent). The
    loss is the mean over ranks of each rank's loss, whose gradient is what DDP's averaging gives;
    the recorded loss of rank ``r`` is its own batch's part, comparable with the candidate's.
    """

    description = "one process, every rank's batch"
    unscales_first = True

    def wrap(self, module: nn.Module) -> nn.Module:
        return module

    def before_step(self) -> None:
        """Coalesce sparse gradients once the scaler has checked them as they came (duplicates
        and all): DDP's sparse all-reduce hands its optimizer coalesced gradients, and the same
        update applied per duplicate would round differently."""
        for _, param in self.named_trainable():
            if param.grad is not None and param.grad.is_sparse:
                param.grad = param.grad.coalesce()

    def losses(self, step: int, scale: float) -> tuple[torch.Tensor, float]:
        batches = [
            to_device(self.finish(self.batch(step, rank), scale), self.device)
            for rank in range(self.world_size)
        ]
        with self.forward_rng(step):
            if self.workload.takes_num_items:
                total = self.num_items(step)
                factor = items.share_factor(self.data_parallel_size, self.config.loop.accumulate)
                parts = [p * factor for p in self.workload.losses(self.module, batches, total)]
            else:
                parts = self.workload.losses(self.module, batches)
        return torch.stack(parts).mean(), parts[self.rank].item()
