"""FSDP1 with ``use_orig_params=True`` and ``Adam(fused=True)`` against DDP with the same optimizer,
in plain torch (no scaler; the harness only builds ``tiny_conv``'s model and batches, as the parity
engine seeds them), on two gloo ranks with one thread each.

What it shows (torch 2.13, CPU): the parameters agree bitwise at step 0, one element of a
parameter split between the two ranks' shards rounds one float32 ulp apart at step 1, and from
step 2 the convolution biases (each before a per-channel GroupNorm, so their true gradient is zero
and their gradient is rounding noise of ~1e-9) move apart by 1e-5 to 1e-4, because Adam divides
each gradient by its own running RMS. ``foreach`` Adam is bitwise throughout, and so are
FSDP1's flat parameters at these steps. The parity engine names it ``noise_gradient``
(``harness/parity/judge/causes/rounding.py``). Run: ``.venv/bin/python docs/repro/fused_adam_orig_params.py``.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD, STEPS = 2, 4


WORKLOAD = "fixtures.user_workloads:tiny_conv"


def train(sharded: bool, fused: bool, rank: int) -> list[dict[str, torch.Tensor]]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from harness.parity.workload import registry

    workload = registry.get(WORKLOAD)
    module = registry.build_model(workload, 0)
    if sharded:
        wrapped = FSDP(
            module,
            device_id=torch.device("cpu"),
            use_orig_params=True,
            auto_wrap_policy=ModuleWrapPolicy({nn.Sequential}),
        )
    else:
        wrapped = nn.parallel.DistributedDataParallel(module)
    kind = {"fused": True} if fused else {"foreach": True}
    optimizer = torch.optim.Adam(wrapped.parameters(), lr=1e-3, **kind)
    seen = []
    for step in range(STEPS):
        inputs, labels = registry.make_batch(workload, 0, rank, step)
        nn.functional.cross_entropy(wrapped(inputs), labels).backward()
        optimizer.step()
        optimizer.zero_grad()
        if sharded:
            with FSDP.summon_full_params(wrapped):
                seen.append(
                    {
                        n.replace("_fsdp_wrapped_module.", ""): p.detach().clone()
                        for n, p in wrapped.named_parameters()
                    }
                )
        else:
            seen.append({n: p.detach().clone() for n, p in module.named_parameters()})
    return seen


def main(rank: int) -> None:
    sys.path.insert(0, os.getcwd())  # the repository root: harness and fixtures
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    for fused in (True, False):
        ddp, fsdp = train(False, fused, rank), train(True, fused, rank)
        if rank == 0:
            print("Adam(fused=True)" if fused else "Adam(foreach=True)")
            for step, (want, got) in enumerate(zip(ddp, fsdp, strict=True)):
                apart = {
                    n: float((want[n] - got[n]).abs().max()) for n in want if not torch.equal(want[n], got[n])
                }
                print(f"  step {step}: " + (", ".join(f"{n} {d:.2g}" for n, d in apart.items()) or "bitwise"))
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(main, nprocs=WORLD)
