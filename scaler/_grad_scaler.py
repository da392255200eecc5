"""GradScaler: a drop-in for ``torch.amp.GradScaler``.

Same constructor, methods, misuse errors, ``state_dict`` keys and pickling as torch's, proven by
the differential tests in ``suites/scaler``. It differs only where torch accepts nonsense: every
constructor argument and ``update(new_scale)`` is validated with an error naming the argument;
and where torch misses an overflow: an uncoalesced sparse grad is checked as coalesced in every
dtype, not only fp16 (see :mod:`scaler._unscale`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable
from typing import Any, overload

import torch

from scaler._checkpoint import ScalerCheckpointing
from scaler._fused import step_with_amp_attributes, takes_grad_scaler_kwarg
from scaler._outputs import scale_outputs
from scaler._records import OptimizerRecords, OptState, sum_on
from scaler._rule import ScaleConfig, ScalerUsageError, check_scale, update_scale_
from scaler._unscale import PerDevice, fresh_flag, unscale_grads_

__all__ = ["GradScaler", "OptState"]


# The stages as module names: an Enum member lookup costs ~70 ns on Python 3.11, and the hot path
# of one iteration reads them about ten times.
_READY, _UNSCALED, _STEPPED = OptState.READY, OptState.UNSCALED, OptState.STEPPED

_NEW_SCALE_REASON = (
    "new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
    "torch.FloatTensor with requires_grad=False."
)


class GradScaler(ScalerCheckpointing):
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
    _keep_output_dtype = False

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
        self._per_optimizer_states: dict[int, dict[str, Any]] = OptimizerRecords()
        self._inv_scale_cpu: torch.Tensor | None = None  # reused on the CPU, see _inv_scale
        self._inv_scale_of: float | None = None  # the scale _inv_scale_cpu holds the inverse of
        self._one: torch.Tensor | None = None  # the fused path's dummy inv_scale

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
        """Multiply a tensor, or a (nested) list/tuple/iterable of tensors, by the current scale.

        The product has torch's type promotion (an fp16 0-dim loss times the float32 scale is
        float32); ShardedGradScaler casts it back to each output's dtype, as torch's does.
        """
        if not self._enabled:
            return outputs
        return scale_outputs(outputs, self._scale_on_first_use, keep_dtype=self._keep_output_dtype)

    def _scale_on_first_use(self, first_output: torch.Tensor) -> torch.Tensor:
        if self._scale is None:
            self._lazy_init_scale_growth_tracker(first_output.device)
        assert self._scale is not None
        return self._scale

    # --------------------------------------------------------------------------------- unscale
    def _unscale_grads(
        self,
        optimizer: torch.optim.Optimizer,
        inv_scale: torch.Tensor,
        found_inf: Callable[[torch.device], torch.Tensor],
        allow_fp16: bool,
    ) -> dict[torch.device, torch.Tensor]:
        return unscale_grads_(
            optimizer,
            inv_scale,
            found_inf,
            allow_fp16=allow_fp16,
            local_dtensor=self._local_dtensor_grads,
            coalesce_fp16=self._coalesce_fp16_sparse,
        )

    @staticmethod
    def _coalesce_fp16_sparse(grad: torch.Tensor) -> torch.Tensor:
        """torch.amp.GradScaler's way: coalesce in fp16 (the sum is fp16's, overflow becomes inf)."""
        return grad.coalesce()

    def _unscale_grads_(
        self,
        optimizer: torch.optim.Optimizer,
        inv_scale: torch.Tensor,
        found_inf: torch.Tensor,
        allow_fp16: bool,
    ) -> dict[torch.device, torch.Tensor]:
        """torch's private helper, same signature and contract: unscale the optimizer's grads by
        ``inv_scale`` and return ``{device: flag}``, each flag a copy of ``found_inf`` on that device
        set to 1.0 if a grad there held an inf/NaN. ``found_inf`` itself is left untouched."""
        return self._unscale_grads(optimizer, inv_scale, PerDevice(found_inf).get, allow_fp16)

    def _inv_scale(self, scale: torch.Tensor) -> torch.Tensor:
        """``1 / scale``, the reciprocal taken in float64 and rounded to float32 (float32 division can
        be imprecise under some compile options; this is torch's arithmetic, bit for bit).

        On the CPU the scale is read on the host (no sync to wait for) and the result written into
        one reused tensor, only when the scale has changed since it was last written (the scale
        moves rarely: most iterations cost one ``item()``). On an accelerator it stays three device
        ops, so the host never waits for the device.
        """
        if scale.device.type != "cpu":
            return scale.double().reciprocal().float()
        value = scale.item()
        inv_scale = self._inv_scale_cpu
        if inv_scale is None:
            inv_scale = self._inv_scale_cpu = torch.empty((), dtype=torch.float32)
        elif value == self._inv_scale_of:
            return inv_scale
        self._inv_scale_of = value
        return inv_scale.fill_(1.0 / value)

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
        if record["stage"] is _UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update()."
            )
        if record["stage"] is _STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        # Fresh zero flags, made directly on each grad's device (no master flag to copy from).
        record["found_inf_per_device"] = self._unscale_grads(
            optimizer, self._inv_scale(scale), fresh_flag, self._allow_fp16_grads
        )
        record["stage"] = _UNSCALED
        self._agree_found_inf(record)

    def _check_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[torch.device, torch.Tensor]:
        """Record inf/NaN in the grads without unscaling them (fused optimizers unscale in-kernel)."""
        scale, _ = self._check_scale_growth_tracker("_check_inf_per_device")
        one = self._one
        if one is None or one.device != scale.device:  # the kernel only reads it: one per scaler
            one = self._one = torch.ones((), dtype=torch.float32, device=scale.device)
        record = self._per_optimizer_states[id(optimizer)]
        record["found_inf_per_device"] = self._unscale_grads(optimizer, one, fresh_flag, True)
        return record["found_inf_per_device"]

    def _found_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[torch.device, torch.Tensor]:
        return self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]

    # ------------------------------------------------------------------------------------ step
    def _maybe_opt_step(
        self, optimizer: torch.optim.Optimizer, record: dict[str, Any], *args: Any, **kwargs: Any
    ) -> Any:
        flags = record["found_inf_per_device"].values()
        if len(flags) == 1:
            (flag,) = flags
            found = flag.item()  # the host sync of the non-fused path (torch's makes it too)
        else:
            found = sum(v.item() for v in flags)
        return None if found else optimizer.step(*args, **kwargs)

    def _step_fused(
        self, optimizer: torch.optim.Optimizer, record: dict[str, Any], *args: Any, **kwargs: Any
    ):
        """Drive an optimizer that unscales and skips inside its own kernel (see :mod:`scaler._fused`)."""
        if takes_grad_scaler_kwarg(optimizer):
            kwargs.update({"grad_scaler": self})
            return optimizer.step(*args, **kwargs)
        if record["stage"] is _READY:
            self._check_inf_per_device(optimizer)
            self._agree_found_inf(record)
        scale = self._scale
        assert scale is not None
        return step_with_amp_attributes(
            optimizer,
            scale=None if record["stage"] is _UNSCALED else scale,
            found_inf=sum_on(scale.device, list(record["found_inf_per_device"].values())),
            args=args,
            kwargs=kwargs,
        )

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
        if record["stage"] is _STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            retval = self._step_fused(optimizer, record, *args, **kwargs)
        else:
            if record["stage"] is _READY:
                self.unscale_(optimizer)
            if not record["found_inf_per_device"]:
                raise ScalerUsageError("No inf checks were recorded for this optimizer.")
            retval = self._maybe_opt_step(optimizer, record, *args, **kwargs)
        record["stage"] = _STEPPED
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
        return sum_on(scale.device, flags)

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
        self._per_optimizer_states = OptimizerRecords()

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
