"""ShardedGradScaler: loss scaling that every rank of a sharded job agrees on.

Why not torch's: its fused-optimizer path never agrees found_inf across ranks (one rank skips
while another steps), its CPU ``update`` can grow the scale to +inf, it defaults to CUDA and
silently disables itself on a CPU machine, and it cannot be pickled once a process group exists.
Here one MAX all-reduce per optimizer step serves every path (plain, ``unscale_``-first, fused),
and the scale moves by the single shared rule in :mod:`scaler._rule`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist

from scaler._grad_scaler import GradScaler
from scaler._rule import update_scale_
from scaler._torch_private import resolve_process_group

__all__ = ["ShardedGradScaler", "default_device"]


def default_device() -> str:
    """The accelerator's device type if this machine has one, else ``"cpu"``."""
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    return accelerator.type if accelerator is not None else "cpu"


def _usable_as_group(group: object) -> bool:
    """Whether ``torch.distributed`` collectives accept ``group``: None (the default group), what
    ``new_group`` returns on a rank outside the group, or anything with ``allreduce`` (a real
    ProcessGroup, or a duck-typed test double such as torch's ``DummyProcessGroup``)."""
    if group is None or isinstance(group, int) and group == dist.GroupMember.NON_GROUP_MEMBER:
        return True
    return callable(getattr(group, "allreduce", None))


def _device_available(device_type: str) -> bool:
    if device_type == "cpu":
        return True
    module = getattr(torch, device_type, None)
    is_available = getattr(module, "is_available", None)
    return bool(is_available()) if callable(is_available) else True


def _backend_of(group: Any) -> str | None:
    """The group's backend name, or None for a group ``torch.distributed`` does not know."""
    try:
        return dist.get_backend(group)
    except (ValueError, RuntimeError, TypeError):  # the type varies between torch versions
        return None


class ShardedGradScaler(GradScaler):
    """A GradScaler for FSDP1, FSDP2 (DTensor), DDP and CPU-offloaded training.

    The loop is GradScaler's; what changes is that ``found_inf`` is agreed across the process
    group once per optimizer step, so all ranks skip (or step) together and hold equal scales::

        scaler = ShardedGradScaler()                       # accelerator if present, else CPU
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)                         # optional: clip grads here
        scaler.step(optimizer)                             # one MAX all-reduce, clamped to 0.0/1.0
        scaler.update()
        if scaler.step_was_skipped(optimizer): ...         # syncs only when you ask

    Args:
        device: device type for the scaler's reductions; ``None`` picks the accelerator if there
            is one, else ``"cpu"``. A device that is not available is an error, never a silent
            disable; ``enabled=False`` is the only way off.
        init_scale: the first scale (finite, > 0).
        growth_factor, backoff_factor, growth_interval: as in GradScaler (keyword-only: torch's
            two scalers order these differently, so a positional call could silently swap them).
        enabled: ``False`` makes every method a pass-through.
        process_group: the group to agree over; ``None`` means the default group, looked up when
            first needed (not at construction or import).
        min_scale, max_scale: optional bounds on the scale; ``None`` keeps torch's behaviour.

    Grads may be fp16 (FSDP mixed precision), sparse (an uncoalesced one is checked as coalesced;
    fp16 ones are coalesced through fp32, as torch's do), DTensors (their local shards are unscaled;
    no per-bucket DTensor reduction), and may live on another device than the scale (CPU offload).
    ``scale(outputs)`` returns each output's own dtype (an fp16 loss stays fp16), as torch's does.
    """

    _allow_fp16_grads = True
    _local_dtensor_grads = True
    _keep_output_dtype = True

    def __init__(
        self,
        device: str | torch.device | None = None,
        init_scale: float = 2.0**16,
        *,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        process_group: dist.ProcessGroup | None = None,
        min_scale: float | None = None,
        max_scale: float | None = None,
    ) -> None:
        if device is None:
            device = default_device()
        device_type = torch.device(device).type
        if enabled and not _device_available(device_type):
            raise ValueError(
                f"device={device_type!r} is not available on this machine; pass device='cpu' "
                "(or leave device=None to pick the accelerator if there is one), or enabled=False"
            )
        if not _usable_as_group(process_group):
            raise TypeError(
                "process_group must be a torch.distributed.ProcessGroup, an object with its allreduce "
                f"method (a test double), or None for the default group; got {type(process_group).__name__}"
            )
        super().__init__(
            device_type,
            init_scale=init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            enabled=enabled,
        )
        self._config = dataclasses.replace(self._config, min_scale=min_scale, max_scale=max_scale)
        if (min_scale is not None and self._init_scale < min_scale) or (
            max_scale is not None and self._init_scale > max_scale
        ):
            raise ValueError(
                f"init_scale={self._init_scale} lies outside [min_scale={min_scale}, max_scale={max_scale}]"
            )
        self._process_group = process_group
        self._process_group_name: str | None = None
        self._steps = 0
        self._skipped_on_host = 0
        self._backoffs_on_host = 0
        self._resets_on_host = 0
        self._counts: dict[str, torch.Tensor | None] = dict.fromkeys(("skipped_steps", "resets", "backoffs"))
        self._reduction_cache: tuple[dist.ProcessGroup, torch.device, torch.device] | None = None
        self._last_found_inf: dict[int, torch.Tensor | bool] = {}
        # Skip decisions made on the host at step() this iteration, by id(optimizer); kept here, not
        # in the per-optimizer records, which hold exactly torch's keys (see scaler._records).
        self._host_skips: dict[int, bool] = {}

    # --------------------------------------------------------------------------- process group
    @property
    def process_group(self) -> dist.ProcessGroup:
        """The group found_inf is agreed over, resolved now (``None`` -> the default group).

        Any object that ``torch.distributed.all_reduce`` accepts as ``group=`` works, registered or
        not (torch's own scaler tests pass a duck-typed ``DummyProcessGroup``)."""
        if self._process_group is None and self._process_group_name is not None:
            self._process_group = resolve_process_group(self._process_group_name)
        if self._process_group is not None:
            return self._process_group
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "ShardedGradScaler needs a process group to agree on found_inf: call "
                "torch.distributed.init_process_group(...) first, or pass process_group=..."
            )
        return dist.group.WORLD

    def _reduction_device(self, scale_device: torch.device, group: dist.ProcessGroup) -> torch.device:
        """Where the flag is reduced: the scale's device, unless the backend cannot reduce there
        (NCCL with a CPU scale). Cached per group: ``get_backend`` is not free on the hot path.
        A group that is not registered with ``torch.distributed`` (a test double) has no backend
        to ask: it reduces on the scale's device."""
        cached = self._reduction_cache
        if cached is not None and cached[0] is group and cached[1] == scale_device:
            return cached[2]
        device = scale_device
        if scale_device.type == "cpu" and _backend_of(group) == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        self._reduction_cache = (group, scale_device, device)
        return device

    def _agree_found_inf(self, record: dict[str, Any]) -> None:
        """Replace the per-device flags with one flag, MAX-reduced over the group, exactly 0.0 or 1.0.

        Every rank reaches this once per optimizer step, with or without grads of its own, so the
        collective is matched on every rank.
        """
        scale = self._scale
        assert scale is not None
        group = self.process_group
        device = self._reduction_device(scale.device, group)
        flags = list(record["found_inf_per_device"].values())
        # The unscale kernel writes exactly 1.0 on overflow, so MAX over such flags is exactly 0.0 or
        # 1.0 (the fused optimizers skip only on 1.0); several per-device flags are combined by MAX too.
        if len(flags) == 1 and flags[0].device == device:
            combined = flags[0]  # a fresh tensor unscale made for this step: reduce it in place
        elif not flags:
            combined = torch.zeros((), dtype=torch.float32, device=device)
        else:
            combined = torch.stack([flag.to(device).reshape(()) for flag in flags]).amax()
        dist.all_reduce(combined, op=dist.ReduceOp.MAX, group=group)
        record["found_inf_per_device"] = {scale.device: combined.to(scale.device)}

    # ------------------------------------------------------------------------------ unscaling
    @staticmethod
    def _coalesce_fp16_sparse(grad: torch.Tensor) -> torch.Tensor:
        """torch's ShardedGradScaler's way: coalesce through fp32, then back to fp16 (a sum past
        fp16's range becomes inf)."""
        return grad.to(torch.float32).coalesce().to(torch.float16)

    def _unscale_grads_(
        self,
        optimizer: torch.optim.Optimizer,
        inv_scale: torch.Tensor,
        found_inf: torch.Tensor,
        allow_fp16: bool = True,
    ) -> dict[torch.device, torch.Tensor]:
        """torch's ShardedGradScaler private helper, same signature (fp16 allowed by default): as
        GradScaler's, and a rank without grads still gets a flag on the scale's device."""
        flags = super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
        if not flags:
            scale, _ = self._check_scale_growth_tracker("_unscale_grads_")
            flags[scale.device] = found_inf.to(scale.device, copy=True)
        return flags

    # ---------------------------------------------------------------------------- observability
    def _counter(self, name: str) -> torch.Tensor:
        """A float64 counter on the scale's device (exact to 2**53; float so flags add without casts)."""
        assert self._scale is not None
        counter = self._counts[name]
        if counter is None:
            counter = torch.zeros((), dtype=torch.float64, device=self._scale.device)
        elif counter.device != self._scale.device:  # restored from a pickle onto another device
            counter = counter.to(self._scale.device)
        self._counts[name] = counter
        return counter

    def _maybe_opt_step(
        self, optimizer: torch.optim.Optimizer, record: dict[str, Any], *args: Any, **kwargs: Any
    ) -> Any:
        (flag,) = record["found_inf_per_device"].values()
        self._host_skips[id(optimizer)] = skipped = bool(flag.item())  # the sync torch's path makes too
        return None if skipped else optimizer.step(*args, **kwargs)

    def _after_step(self, optimizer: torch.optim.Optimizer, record: dict[str, Any]) -> None:
        found = record["found_inf_per_device"]
        if not found:  # deprecated ``grad_scaler=`` optimizers check infs themselves
            return
        self._steps += 1
        skipped = self._host_skips.get(id(optimizer))
        if skipped is not None:  # decided on the host already: count there, no tensor op
            self._skipped_on_host += skipped
            self._last_found_inf[id(optimizer)] = skipped
        else:  # fused: the decision lives on the device; count without syncing
            (flag,) = found.values()
            self._last_found_inf[id(optimizer)] = flag
            self._counter("skipped_steps").add_(flag)

    def _combined_found_inf(self) -> torch.Tensor:
        found = super()._combined_found_inf()
        # Each optimizer's flag is already agreed and exactly 0.0 or 1.0; only a sum over several
        # optimizers can exceed 1.
        return found if len(self._per_optimizer_states) == 1 else found.clamp(max=1.0)

    def _update_scale(self, scale: torch.Tensor, tracker: torch.Tensor, found_inf: torch.Tensor) -> None:
        update_scale_(scale, tracker, found_inf, self._config)
        # The rule resets the tracker on every backoff and every completed growth interval, so
        # growths = resets - backoffs: one comparison counts both, and no copy of the scale is needed.
        # On the CPU the tracker is read on the host (nothing to wait for; two small tensor ops
        # fewer); on an accelerator the count stays on the device, so the host never waits.
        if tracker.is_cpu:
            self._resets_on_host += tracker.item() == 0
        else:
            self._counter("resets").add_(tracker == 0)
        skips = self._host_skips
        if all(key in skips for key in self._per_optimizer_states):  # decided on the host at step()
            self._backoffs_on_host += any(skips[key] for key in self._per_optimizer_states)
        else:
            self._counter("backoffs").add_(found_inf)

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """GradScaler's ``update``; the host-side skip decisions end with the iteration's records."""
        super().update(new_scale)
        self._host_skips.clear()

    def step_was_skipped(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether this optimizer's last ``step`` through this scaler was skipped (syncs the host)."""
        if not self._enabled:
            return False
        flag = self._last_found_inf.get(id(optimizer))
        if flag is None:
            raise ValueError(
                "step_was_skipped(optimizer): this optimizer has not been stepped through this scaler; "
                "call scaler.step(optimizer) first"
            )
        return flag if isinstance(flag, bool) else bool(flag.item())

    def _count(self, name: str) -> int:
        counter = self._counts[name]
        return 0 if counter is None else int(counter.item())

    @property
    def steps(self) -> int:
        """Optimizer steps taken through this scaler (skipped ones included). No host sync."""
        return self._steps

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped because some rank found inf/NaN (syncs when read)."""
        return self._skipped_on_host + self._count("skipped_steps")

    @property
    def growths(self) -> int:
        """``update()`` calls that completed ``growth_interval`` clean steps, so that the scale was
        multiplied by ``growth_factor`` (unless that would pass ``max_scale`` or float32's range).
        Syncs when read."""
        return self._resets_on_host + self._count("resets") - self.backoffs

    @property
    def backoffs(self) -> int:
        """``update()`` calls that backed the scale off (syncs when read)."""
        return self._backoffs_on_host + self._count("backoffs")

    def get_min_scale(self) -> float | None:
        return self._config.min_scale

    def get_max_scale(self) -> float | None:
        return self._config.max_scale

    # ---------------------------------------------------------------------------- serialisation
    def _set_scale(self, new_scale: float | torch.Tensor) -> None:
        super()._set_scale(new_scale)
        if self._config.min_scale is not None or self._config.max_scale is not None:
            value = self.get_scale()
            lo, hi = self._config.min_scale, self._config.max_scale
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                raise ValueError(f"new_scale={value} lies outside [min_scale={lo}, max_scale={hi}]")

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        group = state.pop("_process_group")
        # A ProcessGroup cannot be pickled; its name can, and resolves to the same group in any
        # process that created it (names are assigned identically on every rank).
        state["_process_group"] = None
        if isinstance(group, getattr(dist, "ProcessGroup", ())):
            state["_process_group_name"] = group.group_name
        else:  # not registered (a test double, NON_GROUP_MEMBER): pickled as it is, if it can be
            state["_process_group"] = group
        state["_counts"] = {name: None if c is None else c.item() for name, c in self._counts.items()}
        state["_last_found_inf"] = {}
        state["_reduction_cache"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("_resets_on_host", 0)  # pickles made before the host-side count existed
        state.setdefault("_host_skips", {})  # ... and before skip decisions left the records
        state["_counts"] = {
            name: None if value is None else torch.tensor(value, dtype=torch.float64)
            for name, value in state["_counts"].items()
        }
        super().__setstate__(state)
