"""``fully_shard`` (FSDP2) internals the harness reads: a unit's state and parameter groups, a
parameter's owner, how FSDP2 routes a unit's inputs through its post-backward node, and the
reduction the staged check observes.

Read from torch 2.11, 2.12, 2.13 and 2.14 (``torch/distributed/fsdp/_fully_shard/``). Where they
differ, each function branches: torch 2.11 keeps one parameter group per state
(``FSDPState._fsdp_param_group``) where 2.12 made it a list (``_fsdp_param_groups``, the old name a
property over it), and 2.11 finds a unit's grad-requiring inputs with ``tree_flatten`` where 2.12
added ``collect_grad_tensors``, which also walks dataclasses.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from harness.torch_private import at_least
from harness.torch_private.patches import PatchSite

REDUCE = PatchSite(
    module="torch.distributed.fsdp._fully_shard._fsdp_param_group",
    name="foreach_reduce",
    parameters=("fsdp_params", "unsharded_grads"),
    called_from="FSDPParamGroup.post_backward",
    reads=(("torch.distributed.fsdp._fully_shard._fsdp_param", "FSDPParam.__init__", ("_param_fqn",)),),
)
"""Every reduce-scatter of a ``fully_shard`` group goes through ``foreach_reduce`` (a custom
``set_custom_reduce_scatter`` included), each gradient in the compute dtype, in 2.11-2.14 alike."""


def state_of(module: Any) -> Any:
    """The ``FSDPState`` of a ``fully_shard``-ed module (``FSDPModule._get_fsdp_state``, 2.11-2.14)."""
    return module._get_fsdp_state()


def param_groups(state: Any) -> list[Any]:
    """The parameter groups of a unit's state: 2.12+ keep a list (``_fsdp_param_groups``); 2.11
    keeps one group or ``None`` (``_fsdp_param_group``). Empty for a unit without parameters."""
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    group = getattr(state, "_fsdp_param_group", None)
    return [] if group is None else [group]


def state_mesh_info(state: Any) -> Any:
    """The mesh info a state without parameter groups keeps (a pipeline stage's root over its
    layers), or ``None`` where the torch keeps none (2.11, and 2.13 for such a root)."""
    return getattr(state, "_mesh_info", None)


def state_policy(state: Any) -> Any:
    """The ``MixedPrecisionPolicy`` the unit was given (``FSDPState._mp_policy``, 2.11-2.14)."""
    return state._mp_policy


def has_all_reduce_hook(group: Any) -> bool:
    """Whether ``set_all_reduce_hook`` gave the group a hook (``_all_reduce_hook``, 2.11-2.14)."""
    return getattr(group, "_all_reduce_hook", None) is not None


def has_custom_reduce_scatter(group: Any) -> bool:
    """Whether ``set_custom_reduce_scatter`` replaced the group's reduce-scatter: its
    ``_reduce_scatter_comm`` is no longer torch's ``DefaultReduceScatter`` (2.11-2.14)."""
    comm = getattr(group, "_reduce_scatter_comm", None)
    return comm is not None and type(comm).__name__ != "DefaultReduceScatter"


def param_owner(fsdp_param: Any) -> tuple[Any, str]:
    """``(module, name in it)`` of the parameter an ``FSDPParam`` manages (``_module_info``,
    2.11-2.14): named by the module that holds it, not by ``_param_fqn``, which is relative to
    whichever module is FSDP's root."""
    info = fsdp_param._module_info
    return info.module, info.param_name


def grad_tensors(tree: Any) -> tuple[Any, ...]:
    """The grad-requiring tensors of a unit's ``(args, kwargs)`` in the order FSDP2's pre-forward
    finds them: torch's ``collect_grad_tensors`` (2.12+: dicts, lists, tuples, named tuples and
    dataclasses), else the leaves of ``tree_flatten`` (2.11's ``_register_post_backward_hook``)."""
    if at_least(2, 12):
        from torch.distributed.fsdp._common_utils import collect_grad_tensors

        return collect_grad_tensors(tree)
    import torch
    from torch.utils._pytree import tree_flatten

    leaves, _ = tree_flatten(tree)
    return tuple(leaf for leaf in leaves if torch.is_tensor(leaf) and leaf.requires_grad)


def replace_grad_tensors(tree: Any, replacements: Iterator[Any]) -> Any:
    """``tree`` with its grad-requiring tensors replaced, in :func:`grad_tensors`'s order, by
    ``replacements`` (torch's ``replace_grad_tensors`` on 2.12+, ``tree_unflatten`` on 2.11)."""
    if at_least(2, 12):
        from torch.distributed.fsdp._common_utils import replace_grad_tensors as replace

        return replace(tree, replacements)
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    leaves, spec = tree_flatten(tree)
    swapped = [next(replacements) if torch.is_tensor(x) and x.requires_grad else x for x in leaves]
    return tree_unflatten(swapped, spec)
