"""DDP internals the harness uses: the parameters a reference's DDP is told to leave alone.

Read from torch 2.11, 2.12, 2.13 and 2.14 (``torch/nn/parallel/distributed.py``): the same.
"""

from __future__ import annotations

from typing import Any


def ignore_for_model(module: Any, names: list[str]) -> None:
    """Tell DDP to leave ``names`` (parameters or buffers of ``module``) out of its buckets and
    broadcasts (``DistributedDataParallel._set_params_and_buffers_to_ignore_for_model``)."""
    from torch.nn.parallel import DistributedDataParallel

    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, names)
