"""What of a scaler survives a checkpoint or a pickle, in torch's layout.

Why a module of its own: these four methods are a contract with torch (``state_dict`` keys and
values, the refusal to pickle mid-iteration, tensors re-created lazily after unpickling) that
checkpoints moving between torch and shardscale depend on; :class:`scaler.GradScaler` mixes them in
and the differential tests hold them to torch's behaviour.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from scaler._rule import ScalerUsageError, check_scale

__all__ = ["ScalerCheckpointing"]


class ScalerCheckpointing:
    """``state_dict``/``load_state_dict`` and pickling for :class:`scaler.GradScaler`.

    Reads and writes the scaler's ``_enabled``, ``_config``, ``_init_scale``,
    ``_init_growth_tracker``, ``_scale``, ``_growth_tracker`` and ``_per_optimizer_states``, and its
    ``get_scale``/``_get_growth_tracker``.
    """

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
        state["_inv_scale_cpu"] = state["_one"] = state["_inv_scale_of"] = None  # caches: re-made when needed
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("_inv_scale_cpu", None)  # pickles made before these caches existed
        state.setdefault("_inv_scale_of", None)
        state.setdefault("_one", None)
        self.__dict__.update(state)
