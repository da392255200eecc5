"""ShardedOptimizer: a local optimizer over named, possibly sharded parameters, with reshardable state.

Why not torch's ``torch.distributed._shard.sharded_optim.ShardedOptimizer``: its ``state_dict``,
``load_state_dict`` and ``add_param_group`` raise NotImplementedError, it skips step hooks, and it
knows nothing of DTensor. This one keeps its constructor and finishes the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from scaler._optim_params import NamedParam, resolve_named_params
from scaler._optim_state import pack_param_state, unpack_param_state

_AMP_ATTRIBUTES = ("grad_scale", "found_inf")


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class ShardedOptimizer(torch.optim.Optimizer):
    """Step a local ``optimizer_class`` on this rank's part of named parameters; save state by name.

    ``named_params`` maps names to parameters (or is an iterable of ``(name, param)`` pairs such as
    ``model.named_parameters()``, or a list of param-group dicts whose ``"params"`` are such
    mappings). A parameter is a plain tensor (replicated), a DTensor placed with ``Shard``/
    ``Replicate`` (its local shard is optimized) or a ShardedTensor (its local shards are)::

        opt = ShardedOptimizer(dict(model.named_parameters()), torch.optim.Adam, lr=1e-3)
        scaler.scale(loss).backward()
        scaler.step(opt)      # ShardedGradScaler: one found_inf agreement, then opt.step() or skip
        scaler.update()
        opt.zero_grad()

    **What the local optimizer sees.** ``param_groups[*]["params"]`` hold *plain local tensors*
    (the plain parameter, the DTensor's ``_local_tensor``, each ShardedTensor local shard), so the
    local optimizer, fused kernels included, never dispatches through DTensor, and a scaler that
    unscales ``param.grad`` for the params in ``param_groups`` works unchanged. A DTensor's gradient
    lands on the DTensor; a post-accumulate-grad hook (and ``step()`` again, for grads assigned by
    hand) sets the local tensor's ``.grad`` to *the same tensor object* as the DTensor gradient's
    local shard, so an in-place unscale or clip of one is seen through the other. A gradient with
    other placements than its parameter is redistributed to the parameter's placements first.
    ``zero_grad`` clears both.

    **AMP.** When the local optimizer is fused (``Adam(fused=True)`` etc.), the wrapper reports
    ``_step_supports_amp_scaling`` and forwards the ``grad_scale``/``found_inf`` a scaler sets on it
    to the local optimizer for that step, so the fused kernel unscales and skips by itself.

    **state_dict.** torch.optim's layout with names in place of indices, plus the optimizer class::

        {"state": {name: {key: value}},                  # only parameters that have state
         "param_groups": [{"params": [name, ...], **hyperparameters}],
         "optimizer_class": "torch.optim.adam.Adam"}

    A state tensor shaped like the local shard of a DTensor parameter is a DTensor with the
    parameter's mesh and placements (global shape, shard offsets implied); of a ShardedTensor
    parameter, a ShardedTensor with the parameter's shard metadata. Scalars and the state of plain
    parameters are replicated and stored as they are. Tensors are references, as in torch.optim.

    **Resharding** goes through ``torch.distributed.checkpoint`` (DCP), which is built for it: save
    ``{"optim": opt.state_dict()}`` with ``dcp.save`` at any world size; to load at another world
    size, build the model and optimizer there, call :meth:`initialize_state` (DCP loads in place,
    so the state tensors must exist), then ``sd = opt.state_dict(); dcp.load({"optim": sd}, ...);
    opt.load_state_dict(sd)``. DCP assembles each rank's new shards from whichever ranks saved
    them. Without DCP, ``load_state_dict`` takes this rank's own ``state_dict()`` (same world size
    and mesh) or a *full* state in which every state tensor is a plain tensor of the parameter's
    global shape; each rank then slices out its shards.

    Supported optimizers are elementwise ones (SGD, Adam, AdamW, Adagrad, RMSprop, ...), whose
    per-parameter state is scalars or tensors shaped like the parameter.
    """

    def __init__(
        self,
        named_params: Mapping[str, torch.Tensor] | Any,
        optimizer_class: type[torch.optim.Optimizer],
        *optimizer_args: Any,
        **optimizer_kwargs: Any,
    ) -> None:
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise TypeError(
                f"optimizer_class must be a torch.optim.Optimizer subclass such as torch.optim.Adam, "
                f"got {optimizer_class!r}"
            )
        self._optimizer_class = optimizer_class
        self._optimizer_args = optimizer_args
        self._optimizer_kwargs = optimizer_kwargs
        self._optim: torch.optim.Optimizer | None = None
        self._named: dict[str, NamedParam] = {}
        self._groups: list[list[NamedParam]] = []
        self._grad_hooks: list[Any] = []
        is_group_list = (
            isinstance(named_params, (list, tuple))
            and len(named_params) > 0
            and all(isinstance(group, dict) for group in named_params)
        )
        groups = list(named_params) if is_group_list else [{"params": named_params}]
        # The base constructor sets up the hook registries and the hooked step, then calls our
        # add_param_group per group, which builds the local optimizer on the first one.
        super().__init__(groups, defaults={})
        self._bind_local_optimizer()

    def __getstate__(self) -> dict[str, Any]:
        # torch.optim.Optimizer pickles only defaults/state/param_groups, which would silently
        # lose the names, the local optimizer and the DTensor gradient hooks of this wrapper.
        raise TypeError(
            "ShardedOptimizer cannot be pickled or copied; save opt.state_dict() (torch.save, or "
            "torch.distributed.checkpoint to reshard) and load it into a new ShardedOptimizer"
        )

    # -- what the wrapper exposes ------------------------------------------------------------

    @property
    def local_optimizer(self) -> torch.optim.Optimizer:
        """The ``optimizer_class`` instance that steps this rank's local tensors."""
        assert self._optim is not None
        return self._optim

    @property
    def named_params(self) -> dict[str, torch.Tensor]:
        """Every parameter as the user gave it, by name (torch's ShardedOptimizer has this too)."""
        return {name: named.param for name, named in self._named.items()}

    @property
    def _step_supports_amp_scaling(self) -> bool:  # read by GradScaler.step
        return bool(getattr(self._optim, "_step_supports_amp_scaling", False))

    def _bind_local_optimizer(self) -> None:
        """Share ``param_groups``/``state``/``defaults`` with the local optimizer (rebound after load)."""
        optim = self.local_optimizer
        self.defaults = optim.defaults
        self.param_groups = optim.param_groups
        self.state = optim.state

    # -- parameters and steps -------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of *named* parameters: ``{"params": {name: param}, **hyperparameters}``."""
        if not isinstance(param_group, dict) or "params" not in param_group:
            raise TypeError(
                "param_group must be a dict with a 'params' entry mapping names to parameters, "
                f"got {type(param_group).__name__}"
            )
        where = f"parameter group {len(self._groups)}"
        named = resolve_named_params(param_group["params"], where=where)
        for item in named:
            if item.name in self._named:
                group = next(i for i, g in enumerate(self._groups) if any(n.name == item.name for n in g))
                raise ValueError(
                    f"parameter {item.name!r} of {where} is already in parameter group {group}; "
                    "every parameter belongs to exactly one group"
                )
        local_group = {key: value for key, value in param_group.items() if key != "params"}
        local_group["params"] = [(item.name, slot.tensor) for item in named for slot in item.slots]
        if self._optim is None:
            if not local_group["params"]:
                raise ValueError(
                    f"{where} has no local tensor on this rank (only ShardedTensors without local "
                    "shards); the local optimizer needs at least one tensor to be built"
                )
            self._optim = self._optimizer_class(
                [local_group], *self._optimizer_args, **self._optimizer_kwargs
            )
        else:
            self._optim.add_param_group(local_group)
        for item in named:
            self._named[item.name] = item
            if item.kind == "dtensor" and item.param.requires_grad:
                self._grad_hooks.append(item.param.register_post_accumulate_grad_hook(_GradLinker(item)))
        self._groups.append(named)

    def _link_grads(self) -> None:
        for named in self._named.values():
            named.link_grad()

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """Step the local optimizer; return what ``closure`` returned (None without a closure).

        A scaler's ``grad_scale``/``found_inf`` set on this wrapper are handed to the local
        optimizer for this step only.
        """
        optim = self.local_optimizer
        forwarded = [name for name in _AMP_ATTRIBUTES if name in self.__dict__]
        for name in forwarded:
            setattr(optim, name, self.__dict__[name])
        try:
            if closure is None:
                self._link_grads()
                return optim.step()

            def linked_closure() -> Any:
                with torch.enable_grad():
                    loss = closure()
                self._link_grads()
                return loss

            return optim.step(linked_closure)
        finally:
            for name in forwarded:
                optim.__dict__.pop(name, None)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients of the local tensors and of DTensor parameters (None, or zeros)."""
        self.local_optimizer.zero_grad(set_to_none)
        for named in self._named.values():
            named.clear_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def initialize_state(self) -> None:
        """Create every parameter's optimizer state now, leaving parameters and gradients as they were.

        DCP loads into existing tensors, so an optimizer that has not stepped yet has nothing to
        load into. This runs one local step on zero gradients (for tensors without a gradient)
        and restores parameter values and gradients afterwards. The state it creates is only a
        target for loading: ``load_state_dict`` replaces all of it. No-op once every local tensor
        has state.
        """
        optim = self.local_optimizer
        tensors = [p for group in optim.param_groups for p in group["params"]]
        if all(optim.state.get(p) for p in tensors):
            return
        grads = [p.grad for p in tensors]
        values = [p.detach().clone() for p in tensors]
        for p in tensors:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        try:
            optim.step()
        finally:
            for p, grad, value in zip(tensors, grads, values, strict=True):
                p.copy_(value)
                p.grad = grad

    # -- state ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Name-keyed state (see the class docstring for the layout); runs the state_dict hooks."""
        for pre_hook in self._optimizer_state_dict_pre_hooks.values():
            pre_hook(self)
        optim = self.local_optimizer
        state: dict[str, Any] = {}
        param_groups: list[dict[str, Any]] = []
        for group, named_group in zip(optim.param_groups, self._groups, strict=True):
            for named in named_group:
                slot_states = [optim.state.get(slot.tensor) or {} for slot in named.slots]
                if slot_states and all(slot_states):
                    state[named.name] = pack_param_state(named, slot_states)
            saved_group = {key: value for key, value in group.items() if key not in ("params", "param_names")}
            saved_group["params"] = [named.name for named in named_group]
            param_groups.append(saved_group)
        state_dict: dict[str, Any] = {
            "state": state,
            "param_groups": param_groups,
            "optimizer_class": _qualname(self._optimizer_class),
        }
        for post_hook in self._optimizer_state_dict_post_hooks.values():
            result = post_hook(self, state_dict)
            if result is not None:
                state_dict = result
        return state_dict

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a name-keyed state; see the class docstring for which forms load at which sizes.

        Raises ValueError naming the parameter for a name, group or shape that does not match,
        and for a state saved by another optimizer class.
        """
        if (
            not isinstance(state_dict, Mapping)
            or "state" not in state_dict
            or "param_groups" not in state_dict
        ):
            raise TypeError(
                "state_dict must be a mapping with 'state' and 'param_groups' entries, as returned by "
                f"ShardedOptimizer.state_dict(); got {type(state_dict).__name__}"
            )
        state_dict = dict(state_dict)
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = pre_hook(self, state_dict)
            if result is not None:
                state_dict = result
        saved_state = state_dict["state"]
        saved_groups = state_dict["param_groups"]
        self._check_loadable(state_dict, saved_state, saved_groups)

        local_state: dict[int, dict[str, Any]] = {}
        local_groups: list[dict[str, Any]] = []
        index = 0
        for saved_group, named_group in zip(saved_groups, self._groups, strict=True):
            indices: list[int] = []
            for named in named_group:
                slot_states = (
                    unpack_param_state(named, saved_state[named.name])
                    if named.name in saved_state
                    else [{} for _ in named.slots]
                )
                for slot_state in slot_states:
                    if slot_state:
                        local_state[index] = slot_state
                    indices.append(index)
                    index += 1
            local_group = {key: value for key, value in saved_group.items() if key != "params"}
            local_group["params"] = indices
            local_groups.append(local_group)
        self.local_optimizer.load_state_dict({"state": local_state, "param_groups": local_groups})
        self._bind_local_optimizer()
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)

    def _check_loadable(self, state_dict: dict[str, Any], saved_state: Any, saved_groups: Any) -> None:
        ours = [named.name for named in self._named.values()]
        saved_class = state_dict.get("optimizer_class")
        if saved_class is not None and saved_class != _qualname(self._optimizer_class):
            raise ValueError(
                f"state_dict was saved by {saved_class}, but this ShardedOptimizer steps "
                f"{_qualname(self._optimizer_class)}; cannot load the state of parameters "
                f"{sorted(saved_state) if isinstance(saved_state, Mapping) else ours}"
            )
        if not isinstance(saved_state, Mapping) or not isinstance(saved_groups, (list, tuple)):
            raise TypeError(
                "state_dict['state'] must map parameter names to state and state_dict['param_groups'] "
                f"must be a list, got {type(saved_state).__name__} and {type(saved_groups).__name__}"
            )
        saved_names = [name for group in saved_groups for name in group.get("params", [])]
        for name in saved_state:
            if name not in self._named:
                raise ValueError(
                    f"state_dict has state for parameter {name!r}, which this optimizer does not have; "
                    f"optimizer parameters: {ours}"
                )
        if len(saved_groups) != len(self._groups):
            raise ValueError(
                f"state_dict has {len(saved_groups)} parameter groups, this optimizer has "
                f"{len(self._groups)}; add the same groups (add_param_group) before loading"
            )
        for number, (saved_group, named_group) in enumerate(zip(saved_groups, self._groups, strict=True)):
            saved_in_group = list(saved_group.get("params", []))
            for named in named_group:
                if named.name not in saved_in_group:
                    where = "in another parameter group" if named.name in saved_names else "no entry"
                    raise ValueError(
                        f"state_dict has {where} for parameter {named.name!r} of parameter group "
                        f"{number}; saved parameters of that group: {saved_in_group}"
                    )
            extra = [name for name in saved_in_group if name not in {n.name for n in named_group}]
            if extra:
                raise ValueError(
                    f"state_dict parameter group {number} has parameter {extra[0]!r}, which this "
                    f"optimizer's group {number} does not have; group parameters: "
                    f"{[n.name for n in named_group]}"
                )


class _GradLinker:
    """Post-accumulate-grad hook of a DTensor parameter: link its gradient to the local shard.

    A class, not a closure, so that the hook's job has a name in tracebacks and reprs.
    """

    def __init__(self, named: NamedParam) -> None:
        self._named = named

    def __call__(self, param: torch.Tensor) -> None:
        self._named.link_grad()
