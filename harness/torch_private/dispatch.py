"""Dispatch modes and pytrees: how the localization sees the ATen ops a module's forward ran.

Read from torch 2.11, 2.12, 2.13 and 2.14 (``torch/utils/_python_dispatch.py``,
``torch/utils/_pytree.py``): the same.
"""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["TorchDispatchMode", "tree_leaves"]
