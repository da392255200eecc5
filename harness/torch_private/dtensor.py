"""DTensor internals the harness uses: dropping its sharding-propagation cache between process
groups.

Read from torch 2.11, 2.12, 2.13 and 2.14: each has ``torch.distributed.tensor.debug.
_clear_sharding_prop_cache``; older releases kept the cache on the op dispatcher's propagator,
which the fallback clears.
"""

from __future__ import annotations

import sys


def clear_sharding_cache() -> None:
    """Drop DTensor's cached sharding decisions (keyed by mesh equality, which ignores the mesh's
    process groups: a case after the group was rebuilt could get a mesh of a destroyed group).
    Nothing to do if DTensor was never imported."""
    if "torch.distributed.tensor" not in sys.modules:
        return
    try:
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache
    except ImportError:
        from torch.distributed.tensor import DTensor

        propagate = DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding
        clear = getattr(getattr(propagate, "cache", propagate), "cache_clear", None)
        if clear is not None:
            clear()
        return
    _clear_sharding_prop_cache()
