"""A short fp16 mixed-precision training run on CPU that shows the scaler at work.

``python -m scaler.demo`` (``make demo``) trains a small MLP under ``torch.autocast("cpu",
dtype=torch.float16)`` with a deliberately large initial scale: the first steps overflow in fp16,
are skipped and back the scale off; then training proceeds and the scale grows every
``growth_interval`` clean steps. It prints the trajectory and a summary, and exits non-zero if the
loss did not go down over the steps that trained (so it doubles as a smoke test of the loop).
"""

from __future__ import annotations

import argparse
import math
import sys

import torch

from scaler import GradScaler


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m scaler.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="training steps (default: 60)")
    parser.add_argument(
        "--init-scale", type=float, default=2.0**24, help="initial loss scale (default: 2**24)"
    )
    parser.add_argument(
        "--growth-interval", type=int, default=10, help="clean steps before growth (default: 10)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if not (math.isfinite(args.init_scale) and args.init_scale > 0):
        parser.error(
            f"--init-scale must be a finite number > 0, got {args.init_scale}; e.g. --init-scale 65536"
        )
    if args.growth_interval < 1:
        parser.error(f"--growth-interval must be >= 1, got {args.growth_interval}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = GradScaler("cpu", init_scale=args.init_scale, growth_interval=args.growth_interval)
    inputs = torch.randn(256, 32)
    target = inputs[:, :4].sum(dim=1, keepdim=True).tanh()

    print(f"{'step':>4}  {'loss':>9}  {'scale':>12}  skipped")
    losses, trained, skipped = [], [], 0
    for step in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(inputs).float(), target)
        scale_used = scaler.get_scale()
        scaler.scale(loss).backward()
        before = model[0].weight.detach().clone()
        scaler.step(optimizer)
        scaler.update()
        was_skipped = torch.equal(before, model[0].weight)
        skipped += was_skipped
        losses.append(loss.item())
        if not was_skipped:
            trained.append(loss.item())
        if was_skipped or step % 5 == 0 or step == args.steps - 1:
            print(f"{step:>4}  {loss.item():>9.5f}  {scale_used:>12.1f}  {'yes' if was_skipped else ''}")
    print(
        f"\n{args.steps} steps, {skipped} skipped; scale {args.init_scale:.0f} -> {scaler.get_scale():.0f}; "
        f"loss {losses[0]:.5f} -> {losses[-1]:.5f}"
    )
    if len(trained) < 2:
        print(
            f"only {len(trained)} step(s) trained (the rest overflowed while the scale backed off): "
            "no trend to check; give more --steps or a smaller --init-scale"
        )
        return 0
    if not trained[-1] < trained[0]:
        print("error: the loss did not decrease over the steps that trained", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
