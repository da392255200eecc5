"""``torch.nn`` internals the harness reads: the base class every batch norm shares.

Read from torch 2.11, 2.12, 2.13 and 2.14 (``torch/nn/modules/batchnorm.py``): the same.
``BatchNorm1d/2d/3d``, their lazy forms and ``SyncBatchNorm`` all derive from ``_BatchNorm``, and
so may a user's own batch norm: an ``isinstance`` against it finds every one.
"""

from __future__ import annotations


def batch_norm_base() -> type:
    """``torch.nn.modules.batchnorm._BatchNorm``."""
    from torch.nn.modules.batchnorm import _BatchNorm

    return _BatchNorm
