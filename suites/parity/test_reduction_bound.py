"""The order-free bound of a reduction (``ranks/measure/bound.py``): every order of summation lies
inside it, and the bugs it must catch lie outside.

Why pure tests here: the bound is a claim about floating-point sums, checkable without ranks: the
ranks' local values are drawn, summed in many orders in the reduce dtype (and divided as FSDP
divides), and every result is checked against the bound computed from the float64 mean and mean
absolute value, as the staged check computes them.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from harness.parity.ranks.measure import bound


def _local(world: int, numel: int, seed: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """Ranks' local gradients with wide magnitudes and signs (many nearly cancelling sums)."""
    gen = torch.Generator().manual_seed(seed)
    scales = torch.logspace(-6, 2, numel, dtype=torch.float64)
    return [(torch.randn(numel, generator=gen, dtype=torch.float64) * scales).to(dtype) for _ in range(world)]


def _means(local: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    stacked = torch.stack([t.double() for t in local])
    return stacked.mean(0), stacked.abs().mean(0)


def _sum_in_order(
    local: list[torch.Tensor], order: tuple[int, ...], dtype: torch.dtype, pre: float, post: float
):
    total = (local[order[0]].to(dtype) / pre).to(dtype)
    for rank in order[1:]:
        total = total + (local[rank].to(dtype) / pre).to(dtype)
    return (total / post).to(dtype)


@pytest.mark.parametrize("world", [3, 4, 5, 8])
@pytest.mark.parametrize(
    ("dtype", "pre"),
    [(torch.float32, 1.0), (torch.bfloat16, 1.0), (torch.float16, 2.0)],
    ids=["fp32-avg", "bf16-avg", "fp16-predivide"],
)
def test_every_order_of_the_sum_lies_within_the_bound(world, dtype, pre):
    local = _local(world, 4096, seed=world, dtype=dtype if dtype != torch.float16 else torch.float32)
    local = [t.clamp(-1000, 1000) for t in local] if dtype == torch.float16 else local
    mean, mean_abs = _means(local)
    orders = list(itertools.permutations(range(world)))[
        :: max(1, len(list(itertools.permutations(range(world)))) // 24)
    ]
    for order in orders:
        reduced = _sum_in_order(local, order, dtype, pre, world / pre)
        found = bound.check(reduced, mean, mean_abs, world, dtype)
        assert found.violations == 0, (order, found)
        assert found.elements == 4096


@pytest.mark.parametrize("world", [4, 8])
def test_a_divide_factor_off_by_one_rank_is_outside_the_bound(world):
    local = _local(world, 4096, seed=1, dtype=torch.float32)
    mean, mean_abs = _means(local)
    reduced = _sum_in_order(local, tuple(range(world)), torch.float32, 1.0, world - 1)
    assert bound.check(reduced, mean, mean_abs, world, torch.float32).violations > 4000


def test_a_rank_left_out_is_outside_the_bound():
    local = _local(4, 4096, seed=2, dtype=torch.float32)
    mean, mean_abs = _means(local)
    reduced = _sum_in_order(local[:3], (0, 1, 2), torch.float32, 1.0, 4)
    assert bound.check(reduced, mean, mean_abs, 4, torch.float32).violations > 4000


def test_a_reduction_in_bfloat16_where_float32_is_configured_is_outside_the_bound():
    local = _local(4, 4096, seed=3, dtype=torch.float32)
    mean, mean_abs = _means(local)
    reduced = _sum_in_order(local, (0, 1, 2, 3), torch.bfloat16, 1.0, 4).to(torch.float32)
    found = bound.check(reduced, mean, mean_abs, 4, torch.float32)
    assert found.violations > 1000 and found.worst_ratio > 1e3


def test_nearly_cancelling_terms_may_move_far_from_their_mean_and_pass():
    """Why a relative tolerance on the result fails: the sum of terms that cancel keeps the
    absolute error of the large terms."""
    terms = torch.tensor([1.0e4, -1.0e4 + 2.0**-10, 1.3e-3, -0.45e-3], dtype=torch.float32).view(4, 1)
    local = [terms[r] for r in range(4)]
    mean, mean_abs = _means(local)
    reduced = _sum_in_order(local, (3, 1, 0, 2), torch.float32, 1.0, 4)
    relative = float(((reduced.double() - mean).abs() / mean.abs()).max())
    assert relative > 0.1  # a quarter of the result: no relative tolerance on it would pass this
    assert bound.check(reduced, mean, mean_abs, 4, torch.float32).violations == 0


def test_gamma_is_infinite_once_k_u_reaches_one():
    assert bound.gamma(2**23, torch.bfloat16) == float("inf")
    assert bound.gamma(3, torch.float32) == pytest.approx(3 * 2.0**-24, rel=1e-6)


def test_microbatches_each_reduced_then_summed_lie_within_the_summed_bound():
    """An accumulation that reduces every microbatch: each reduction in some order, their running
    sum in float32; a rank left out of one microbatch is still outside."""
    world, parts, total = 4, [], None
    for k in range(3):
        local = _local(world, 4096, seed=10 + k, dtype=torch.float32)
        parts.append(_means(local))
        order = tuple(reversed(range(world))) if k % 2 else tuple(range(world))
        reduced = _sum_in_order(local, order, torch.float32, 1.0, world)
        total = reduced if total is None else total + reduced
    assert bound.check_sum(total, parts, world, torch.float32).violations == 0
    broken = total - parts[1][0].float() / world  # a quarter of one microbatch's mean missing
    assert bound.check_sum(broken, parts, world, torch.float32).violations > 1000


def _as_several_reductions(reduced, parts, world, reduce_dtype) -> bound.Checked:
    """The bound of a sum of reductions (each term summed from zero) applied to ``parts`` as is:
    what one reduction's shortcut must equal, bit for bit."""
    out = reduced.dtype
    got = reduced.detach().to(torch.float64).reshape(parts[0][0].shape)
    want = sum((mean for mean, _ in parts), torch.zeros_like(got))
    each = [bound._one(mean, mean_abs, world, reduce_dtype, out) for mean, mean_abs in parts]
    allowed = sum(each, torch.zeros_like(got)) + 4 * 2.0**-53 * sum(
        (mean_abs for _, mean_abs in parts), torch.zeros_like(got)
    )
    finite = got.isfinite() & want.isfinite()
    ratio = torch.where(finite, (got - want).abs() / allowed, torch.zeros_like(got))
    return bound.Checked(int(finite.sum()), int((ratio > 1).sum()), float(ratio.max()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_reduction_is_bounded_as_a_sum_of_one_reduction_bit_for_bit(dtype):
    generator = torch.Generator().manual_seed(0)
    mean = torch.randn(64, generator=generator, dtype=torch.float64)
    mean[:2] = torch.tensor([float("inf"), float("nan")], dtype=torch.float64)  # not judged
    mean_abs = mean.abs() * 1.5  # no zero: every ratio reads every term of its bound
    reduced = (mean * (1 + torch.randn(64, generator=generator, dtype=torch.float64) * 1e-2)).to(dtype)
    shortcut = bound.check_sum(reduced, [(mean, mean_abs)], 4, dtype)
    general = _as_several_reductions(reduced, [(mean, mean_abs)], 4, dtype)
    assert shortcut == general
