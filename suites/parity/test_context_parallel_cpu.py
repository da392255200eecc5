"""Why a ``cp`` mesh dimension is refused on CPU (``plan/config/mesh.py``): torch's own context
parallelism cannot run there. Measured, not assumed: when a torch release runs it, this test fails
and the refusal must go."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 2, 4).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).sum()


def _ring_attention_on_cpu() -> str:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model, tokens = _Attention(), torch.randn(2, 16, 8)
    try:
        with context_parallel(mesh, buffers=[tokens], buffer_seq_dims=[1]):
            model(tokens).backward()
    except NotImplementedError as error:
        return str(error)
    return "ran"


def test_torchs_context_parallel_has_no_ring_attention_for_the_cpu_kernel(ranks):
    found = ranks.run(_ring_attention_on_cpu, world_size=2)
    for said in found:
        assert "_scaled_dot_product_flash_attention_for_cpu" in said, said
        assert "does not have a sharding strategy registered" in said, said
