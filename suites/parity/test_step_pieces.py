"""The pieces a fused optimizer's reference steps are the candidate's local shards, and a step over
them gives the bits a step over each shard alone gives (``harness/parity/ranks/sides/optim/step_pieces.py``).

Why apart from the parity rows (``test_fused_optimizer.py``): a row says the whole is bitwise; these
say which tensor the candidate's optimizer sees on each rank, layout by layout, without ranks:
FSDP2's dim-0 chunks (an empty shard stepping nothing), FSDP1's flat slices with their end padding,
and ``use_orig_params``' per-parameter parts, which start after the alignment padding.
"""

from __future__ import annotations

import pytest
import torch

from harness.parity.ranks.sides.optim import step_pieces
from harness.parity.ranks.sides.reduce_layout import Bucket, Layout

_SHAPES = [torch.Size([5, 3]), torch.Size([6])]


def _numels_and_shapes(found) -> list[tuple[tuple[int, ...], list[tuple[int, int, int]]]]:
    """Each piece's shape and its parts as ``(parameter, start in the flattened parameter or row,
    offset in the piece)``."""
    return [
        (piece.shape, [(part.param, part.narrows[-1][1], part.offset) for part in piece.parts])
        for piece in found
    ]


def test_fsdp2_pieces_are_each_ranks_dim0_chunk_and_an_empty_shard_is_none():
    layout = Layout(engine="fsdp2", buckets=(Bucket((0, 1)),))
    found = step_pieces.pieces(layout, _SHAPES, 4)
    # 5 rows over 4 ranks: 2 + 2 + 1 + 0 (the last rank steps nothing); 6 over 4: 2 + 2 + 2 + 0
    assert _numels_and_shapes(found) == [
        ((2, 3), [(0, 0, 0)]),
        ((2, 3), [(0, 2, 0)]),
        ((1, 3), [(0, 4, 0)]),
        ((2,), [(1, 0, 0)]),
        ((2,), [(1, 2, 0)]),
        ((2,), [(1, 4, 0)]),
    ]


def test_fsdp1_flat_pieces_are_equal_slices_of_the_padded_flat_buffer():
    layout = Layout(engine="fsdp1", buckets=(Bucket((0, 1)),))
    found = step_pieces.pieces(layout, _SHAPES, 4)
    # 15 + 6 = 21 elements, padded to 24: four slices of 6, the second holding both parameters
    assert _numels_and_shapes(found) == [
        ((6,), [(0, 0, 0)]),
        ((6,), [(0, 6, 0)]),
        ((6,), [(0, 12, 0), (1, 0, 3)]),
        ((6,), [(1, 3, 0)]),
    ]


def test_fsdp1_orig_pieces_are_each_parameters_part_of_each_slice_after_its_alignment():
    layout = Layout(engine="fsdp1", buckets=(Bucket((0, 1), align=4),), orig_params=True)
    found = step_pieces.pieces(layout, _SHAPES, 2)
    # parameter 1 starts at 16 (15 aligned to 4); 22 elements padded to 22: slices [0, 11), [11, 22)
    assert _numels_and_shapes(found) == [((11,), [(0, 0, 0)]), ((4,), [(0, 11, 0)]), ((6,), [(1, 0, 0)])]


def test_fsdp1_no_shard_flat_is_one_piece_of_the_whole_flat_parameter():
    layout = Layout(engine="fsdp1", buckets=(Bucket((0, 1)),), sharded=False)
    found = step_pieces.pieces(layout, _SHAPES, 4)
    assert _numels_and_shapes(found) == [((21,), [(0, 0, 0), (1, 0, 15)])]


def test_a_ddp_layout_steps_whole_tensors():
    assert step_pieces.pieces(Layout(engine="ddp", buckets=(Bucket((0, 1)),)), _SHAPES, 4) is None


def test_a_non_fused_optimizer_is_left_as_it_is():
    param = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.Adam([param], foreach=True)
    assert step_pieces.mirror(opt, [param], lambda: None, 2).step.__func__ is torch.optim.Adam.step


_PARAMS, _ROWS, _COLUMNS, _STEPS = 300, 5, 7, 6
"""FSDP2 at 2 ranks cuts each 5 x 7 parameter into 3 + 2 rows (21 and 14 elements): its elements
16 to 31 are in the vector body of the whole tensor (35 elements) and in a scalar tail of a shard."""


def _stepped(layout: Layout | None) -> tuple[list[torch.Tensor], list[dict], list[torch.Tensor], list[dict]]:
    """``_STEPS`` fused Adam steps: mirrored over ``layout`` (full parameters and state), and each
    rank's rows stepped as tensors of their own (parameters and state, shard by shard)."""
    torch.manual_seed(0)
    weights = [torch.randn(_ROWS, _COLUMNS) for _ in range(_PARAMS)]
    grads = [
        [
            torch.randn(_ROWS, _COLUMNS) * 10 ** torch.randint(-6, 1, (_ROWS, _COLUMNS)).float()
            for _ in weights
        ]
        for _ in range(_STEPS)
    ]
    full = [torch.nn.Parameter(w.clone()) for w in weights]
    opt = step_pieces.mirror(torch.optim.Adam(full, lr=1e-3, fused=True), full, lambda: layout, 2)
    shards = [torch.nn.Parameter(rows.clone()) for w in weights for rows in w.split(3)]
    own = torch.optim.Adam(shards, lr=1e-3, fused=True)
    for step in grads:
        for param, grad in zip(full, step, strict=True):
            param.grad = grad.clone()
        opt.step()
        for shard, rows in zip(shards, [rows for grad in step for rows in grad.split(3)], strict=True):
            shard.grad = rows.clone()
        own.step()
    joined = [torch.cat([a.detach(), b.detach()]) for a, b in zip(shards[::2], shards[1::2], strict=True)]
    joined_state = [
        {key: torch.cat([own.state[a][key], own.state[b][key]]) for key in ("exp_avg", "exp_avg_sq")}
        for a, b in zip(shards[::2], shards[1::2], strict=True)
    ]
    return [p.detach() for p in full], [opt.state[p] for p in full], joined, joined_state


def test_a_step_over_the_pieces_is_bitwise_a_fused_step_over_each_shard_alone():
    """The full parameters and state after the mirrored steps equal those of fused Adam run on
    each rank's rows as tensors of their own; the step count is the optimizer's own."""
    params, state, shards, shard_state = _stepped(
        Layout(engine="fsdp2", buckets=(Bucket(tuple(range(_PARAMS))),))
    )
    assert all(torch.equal(a, b) for a, b in zip(params, shards, strict=True))
    for key in ("exp_avg", "exp_avg_sq"):
        assert all(torch.equal(a[key], b[key]) for a, b in zip(state, shard_state, strict=True)), key
    assert {float(s["step"]) for s in state} == {float(_STEPS)}


@pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() == "DEFAULT",
    reason="without vector instructions the kernel's vector body rounds as its scalar tail: no lane to tell",
)
def test_whole_tensors_step_otherwise_than_the_shards_on_a_vector_cpu():
    """The premise of the mirror (and what makes the case above test something): on AVX2 or
    AVX-512 the same steps over whole parameters leave some element a last bit away."""
    params, _, shards, _ = _stepped(None)
    assert not all(torch.equal(a, b) for a, b in zip(params, shards, strict=True))
