"""The matrix's optimizers by name: what ``ParityConfig.optimizer`` means on the ranks.

Why its own module: the engines build the optimizer over the parameters they wrapped, and the
training loop drives it; both need the one definition, and neither may import the other's module
for it.
"""

from __future__ import annotations

import torch


def make_optimizer(kind: str, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """``sgd`` (momentum 0.9), ``adam`` (foreach), ``adam_fused``, ``adamw`` (foreach, weight decay
    0.01) or ``sgd_plain`` over ``params``."""
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    if kind == "sgd_plain":
        return torch.optim.SGD(params, lr=0.05)
    if kind == "adam":
        return torch.optim.Adam(params, lr=1e-3, foreach=True)
    if kind == "adam_fused":
        return torch.optim.Adam(params, lr=1e-3, fused=True)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, foreach=True)
    raise ValueError(f"optimizer must be 'sgd', 'adam', 'adam_fused', 'adamw' or 'sgd_plain', got {kind!r}")
