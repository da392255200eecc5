"""GradScaler: a drop-in for ``torch.amp.GradScaler``.

Same constructor, methods, misuse errors, ``state_dict`` keys and pickling as torch's, proven by
the differential tests in ``suites/scaler``. It differs only where torch accepts nonsense: every
constructor argument and ``update(new_scale)`` is validated with an error naming the argument.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from collections.abc import Iterable
from enum import Enum
from typing import Any, overload

import torch

from scaler._rule import ScaleConfig, ScalerUsageError, check_scale, update_scale_
from scaler._unscale import PerDevice, unscale_grads_

__all__ = ["GradScaler", "OptState"]


class OptState(Enum):
    """Where one optimizer is within the current iteration (reset by ``update()``)."""

    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _fresh_optimizer_record() -> dict[str, Any]:
    return {"stage": OptState.READY, "found_inf_per_device": {}}


class _OptimizerRecords(dict):
    """``id(optimizer) -> {stage, found_inf_per_device}``, created on first access.

    A dict subclass rather than ``defaultdict(lambda ...)`` so that a scaler stays picklable.
    """

    def __missing__(self, key: int) -> dict[str, Any]:
        record = self[key] = _fresh_optimizer_record()
        return record


def _sum_on(device: torch.device, flags: Iterable[torch.Tensor]) -> torch.Tensor:
    """The found_inf flags, moved to ``device`` and added (the flag itself when there is one)."""
    moved = [flag.to(device, non_blocking=True) for flag in flags]
    return moved[0] if len(moved) == 1 else torch.stack(moved).sum()


_NEW_SCALE_REASON = (
    "new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
    "torch.FloatTensor with requires_grad=False."
)


class GradScaler:
    """Dynamic loss scaling for mixed-precision training, interchangeable with torch's.

    The loop::

        scaler = GradScaler("cpu")
        for inputs, target in data:
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), target)
            scaler.scale(loss).backward()   # grads are scaled by S
            scaler.step(optimizer)          # unscale by 1/S; skip the step if any grad is inf/NaN
            scaler.update()                 # back off after an overflow, grow after a clean streak

    The scale rule is :func:`scaler.next_scale_state`; this class keeps the state and the
    per-optimizer bookkeeping (``READY -> UNSCALED -> STEPPED``, reset by ``update``).
    """

    _allow_fp16_grads = False
    _local_dtensor_grads = False

    def __init__(
        self,
        device: str = "cuda",
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        self._device = torch.device(device).type if isinstance(device, torch.device) else device
        self._enabled = bool(enabled)
        if self._device == "cuda" and self._enabled and torch.cuda.amp.common.amp_definitely_not_available():
            warnings.warn(
                "torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.", stacklevel=2
            )
            self._enabled = False
        self._init_scale = check_scale("init_scale", init_scale)
        self._config = ScaleConfig(
            growth_factor=growth_factor, backoff_factor=backoff_factor, growth_interval=growth_interval
        )
        self._init_growth_tracker = 0
        self._scale: torch.Tensor | None = None
        self._growth_tracker: torch.Tensor | None = None
        self._per_optimizer_states: dict[int, dict[str, Any]] = _OptimizerRecords()

    # ----------------------------------------------------------------------------------- scale
    def _lazy_init_scale_growth_tracker(self, device: torch.device) -> None:
        self._scale = torch.full((), self._init_scale, dtype=torch.float32, device=device)
        self._growth_tracker = torch.full((), self._init_growth_tracker, dtype=torch.int32, device=device)

    def _check_scale_growth_tracker(self, funcname: str) -> tuple[torch.Tensor, torch.Tensor]:
        if self._scale is None or self._growth_tracker is None:
            raise ScalerUsageError(
                f"Attempted {funcname} but the scale is not initialised yet. This may indicate your "
                "script did not use scaler.scale(loss or outputs) earlier in the iteration."
            )
        return self._scale, self._growth_tracker

    @overload
    def scale(self, outputs: torch.Tensor) -> torch.Tensor: ...

    @overload
    def scale(self, outputs: list[torch.Tensor]) -> list[torch.Tensor]: ...

    @overload
    def scale(self, outputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]: ...

    @overload
    def scale(self, outputs: Iterable[torch.Tensor]) -> Iterable[torch.Tensor]: ...

    def scale(self, outputs):
        """Multiply a tensor, or a (nested) list/tuple/iterable of tensors, by the current scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            if self._scale is None:
                self._lazy_init_scale_growth_tracker(outputs.device)
            return outputs * self._scale.to(device=outputs.device, non_blocking=True)
        replicated: list[PerDevice] = []

        def apply(value):
            if isinstance(value, torch.Tensor):
                if not replicated:
                    if self._scale is None:
                        self._lazy_init_scale_growth_tracker(value.device)
                    replicated.append(PerDevice(self._scale))
                return value * replicated[0].get(value.device)
            if isinstance(value, Iterable):
                mapped = map(apply, value)
                return type(value)(mapped) if isinstance(value, (list, tuple)) else mapped
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")

        return apply(outputs)

    # --------------------------------------------------------------------------------- unscale
    def _unscale_grads_(
        self,
        optimizer: torch.optim.Optimizer,
        inv_scale: torch.Tensor,
        found_inf: torch.Tensor,
        allow_fp16: bool,
    ) -> dict[torch.device, torch.Tensor]:
        return unscale_grads_(
            optimizer, inv_scale, found_inf, allow_fp16=allow_fp16, local_dtensor=self._local_dtensor_grads
        )

    def _agree_found_inf(self, record: dict[str, Any]) -> None:
        """Hook for ShardedGradScaler: make every rank hold the same found_inf. Local: nothing."""

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the optimizer's grads by the scale in place and record inf/NaN (no host sync).

        Call it once per optimizer per iteration, after all grads are accumulated (e.g. before
        gradient clipping); ``step`` calls it for you otherwise.
        """
        if not self._enabled:
            return
        scale, _ = self._check_scale_growth_tracker("unscale_")
        record = self._per_optimizer_states[id(optimizer)]
        if record["stage"] is OptState.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update()."
            )
        if record["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        # float32 division can be imprecise under some compile options: take the reciprocal in float64.
        inv_scale = scale.double().reciprocal().float()
        found_inf = torch.zeros((), dtype=torch.float32, device=scale.device)
        record["found_inf_per_device"] = self._unscale_grads_(
            optimizer, inv_scale, found_inf, self._allow_fp16_grads
        )
        record["stage"] = OptState.UNSCALED
        self._agree_found_inf(record)

    def _check_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[torch.device, torch.Tensor]:
        """Record inf/NaN in the grads without unscaling them (fused optimizers unscale in-kernel)."""
        scale, _ = self._check_scale_growth_tracker("_check_inf_per_device")
        one = torch.ones((), dtype=torch.float32, device=scale.device)
        found_inf = torch.zeros((), dtype=torch.float32, device=scale.device)
        record = self._per_optimizer_states[id(optimizer)]
        record["found_inf_per_device"] = self._unscale_grads_(optimizer, one, found_inf, True)
        return record["found_inf_per_device"]

    def _found_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[torch.device, torch.Tensor]:
        return self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]

    # ------------------------------------------------------------------------------------ step
    def _maybe_opt_step(
        self, optimizer: torch.optim.Optimizer, record: dict[str, Any], *args: Any, **kwargs: Any
    ) -> Any:
        if not sum(v.item() for v in record["found_inf_per_device"].values()):
            return optimizer.step(*args, **kwargs)
        return None

    def _step_fused(
        self, optimizer: torch.optim.Optimizer, record: dict[str, Any], *args: Any, **kwargs: Any
    ):
        """Drive an optimizer that unscales and skips inside its own kernel.

        It receives ``optimizer.grad_scale`` (None when grads were already unscaled) and
        ``optimizer.found_inf``; the kernel skips only when found_inf is exactly 1.0.
        """
        if "grad_scaler" in inspect.signature(optimizer.step).parameters:
            warnings.warn(
                "GradScaler is going to stop passing itself as a keyword argument to the passed "
                "optimizer. In the near future GradScaler registers `grad_scale: Tensor` and "
                "`found_inf: Tensor` to the passed optimizer and let the optimizer use them directly.",
                FutureWarning,
                stacklevel=3,
            )
            kwargs.update({"grad_scaler": self})
            return optimizer.step(*args, **kwargs)
        if record["stage"] is OptState.READY:
            self._check_inf_per_device(optimizer)
            self._agree_found_inf(record)
        scale = self._scale
        assert scale is not None
        found_inf = _sum_on(scale.device, record["found_inf_per_device"].values())
        if record["stage"] is OptState.UNSCALED:
            optimizer.grad_scale = getattr(optimizer, "grad_scale", None)  # type: ignore[attr-defined]
        else:
            optimizer.grad_scale = scale * getattr(optimizer, "grad_scale", 1)  # type: ignore[attr-defined]
        optimizer.found_inf = found_inf  # type: ignore[attr-defined]
        try:
            return optimizer.step(*args, **kwargs)
        finally:
            del optimizer.grad_scale  # type: ignore[attr-defined]
            del optimizer.found_inf  # type: ignore[attr-defined]

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        """Unscale (unless ``unscale_`` ran), then call ``optimizer.step`` unless a grad was inf/NaN.

        Returns what ``optimizer.step`` returned, or None when the step was skipped.
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale_growth_tracker("step")
        record = self._per_optimizer_states[id(optimizer)]
        if record["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            retval = self._step_fused(optimizer, record, *args, **kwargs)
        else:
            if record["stage"] is OptState.READY:
                self.unscale_(optimizer)
            if not record["found_inf_per_device"]:
                raise ScalerUsageError("No inf checks were recorded for this optimizer.")
            retval = self._maybe_opt_step(optimizer, record, *args, **kwargs)
        record["stage"] = OptState.STEPPED
        self._after_step(optimizer, record)
        return retval

    def _after_step(self, optimizer: torch.optim.Optimizer, record: dict[str, Any]) -> None:
        """Hook for subclasses that observe steps (counters); nothing here, to keep the hot path lean."""

    # ---------------------------------------------------------------------------------- update
    def _set_scale(self, new_scale: float | torch.Tensor) -> None:
        scale = self._scale
        assert scale is not None
        if isinstance(new_scale, torch.Tensor):
            if (
                new_scale.device.type != scale.device.type
                or new_scale.numel() != 1
                or new_scale.requires_grad
            ):
                raise ValueError(f"update(new_scale=...): {_NEW_SCALE_REASON}")
            check_scale("new_scale", float(new_scale.item()))
            scale.copy_(new_scale.reshape(()))
        else:
            scale.fill_(check_scale("new_scale", new_scale))

    def _combined_found_inf(self) -> torch.Tensor:
        scale = self._scale
        assert scale is not None
        flags = [
            flag
            for record in self._per_optimizer_states.values()
            for flag in record["found_inf_per_device"].values()
        ]
        if not flags:
            raise ScalerUsageError(
                "No inf checks were recorded prior to update(): call scaler.step(optimizer) first."
            )
        return _sum_on(scale.device, flags)

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """End the iteration: move the scale by the rule (or set it to ``new_scale``).

        ``new_scale`` may be a positive finite float or a one-element tensor on the scale's device
        type; it is copied, so later changes to that tensor do not affect the scaler.
        """
        if not self._enabled:
            return
        scale, tracker = self._check_scale_growth_tracker("update")
        if new_scale is not None:
            self._set_scale(new_scale)
        else:
            self._update_scale(scale, tracker, self._combined_found_inf())
        self._per_optimizer_states = _OptimizerRecords()

    def _update_scale(self, scale: torch.Tensor, tracker: torch.Tensor, found_inf: torch.Tensor) -> None:
        update_scale_(scale, tracker, found_inf, self._config)

    # ----------------------------------------------------------------------------- accessors
    def _get_scale_async(self) -> torch.Tensor | None:
        return self._scale

    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when disabled). Syncs with the device."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else float(self._scale.item())

    def _get_growth_tracker(self) -> int:
        if not self._enabled:
            return 0
        return self._init_growth_tracker if self._growth_tracker is None else int(self._growth_tracker.item())

    def get_growth_factor(self) -> float:
        return self._config.growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._config = dataclasses.replace(self._config, growth_factor=new_factor)

    def get_backoff_factor(self) -> float:
        return self._config.backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._config = dataclasses.replace(self._config, backoff_factor=new_factor)

    def get_growth_interval(self) -> int:
        return self._config.growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._config = dataclasses.replace(self._config, growth_interval=new_interval)

    def is_enabled(self) -> bool:
        return self._enabled

    # ------------------------------------------------------------------------- serialisation
    def state_dict(self) -> dict[str, Any]:
        """``{scale, growth_factor, backoff_factor, growth_interval, _growth_tracker}`` as Python
        numbers (torch's keys, so checkpoints move between torch and shardscale); ``{}`` if disabled."""
        if not self._enabled:
            return {}
        return {
            "scale": self.get_scale(),
            "growth_factor": self._config.growth_factor,
            "backoff_factor": self._config.backoff_factor,
            "growth_interval": self._config.growth_interval,
            "_growth_tracker": self._get_growth_tracker(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` (ours or torch's) returned; a no-op when disabled."""
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved "
                "from a disabled instance of GradScaler."
            )
        missing = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"} - set(
            state_dict
        )
        if missing:
            raise KeyError(
                f"state_dict is missing {sorted(missing)}; pass what GradScaler.state_dict() returned"
            )
        self._config = dataclasses.replace(
            self._config,
            growth_factor=state_dict["growth_factor"],
            backoff_factor=state_dict["backoff_factor"],
            growth_interval=state_dict["growth_interval"],
        )
        self._init_scale = check_scale("state_dict['scale']", state_dict["scale"])
        self._init_growth_tracker = int(state_dict["_growth_tracker"])
        if self._scale is not None:
            self._scale.fill_(self._init_scale)
        if self._growth_tracker is not None:
            self._growth_tracker.fill_(self._init_growth_tracker)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if self._enabled:
            if len(self._per_optimizer_states) != 0:
                raise ScalerUsageError(
                    "A GradScaler instance may only be pickled at the beginning "
                    "of an iteration, or at the end after scaler.update()."
                )
            # Tensors are re-created lazily on the unpickling side, on the device of the first output.
            state["_init_scale"] = self.get_scale()
            state["_init_growth_tracker"] = self._get_growth_tracker()
            state["_scale"] = None
            state["_growth_tracker"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
