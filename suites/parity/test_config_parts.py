"""A configuration is a small core and one frozen part per concern (``plan/config/``): each part
owns its validation, its words in the id and its share of the reference key, and ``flat()`` keeps
the flat names ``parity.json`` and ``-k`` know."""

from __future__ import annotations

import dataclasses

import pytest

from harness.parity.plan.config import Layout, Loop, Mesh, ParityConfig, Precision, Resume, Scale
from harness.parity.plan.matrices import default as matrix

PARTS = (Layout, Mesh, Precision, Loop, Resume, Scale)


def test_the_configuration_holds_at_most_ten_fields_of_its_own_beside_its_parts():
    own = [
        f.name
        for f in dataclasses.fields(ParityConfig)
        if f.type not in {part.__name__ for part in PARTS} and f.name != "faults"
    ]
    assert len(own) <= 10, own


@pytest.mark.parametrize("config", matrix.default_matrix(world_size=4)[::7], ids=lambda c: c.id)
def test_a_configuration_read_back_from_its_flat_fields_is_the_same(config):
    assert ParityConfig.from_flat(**config.flat()) == config


def test_with_changes_a_parts_field_by_its_flat_name_and_keeps_the_rest_of_the_part():
    clipped = ParityConfig(engine="fsdp2", layout=Layout(reshard_after_forward=True)).with_(
        path="unscale_clip", clip=0.05, accumulate=2
    )
    assert clipped.loop == Loop(path="unscale_clip", clip=0.05, accumulate=2)
    assert clipped.layout == Layout(reshard_after_forward=True)


def test_the_float32_twin_of_a_recipe_has_no_recipe():
    mixed = ParityConfig(
        engine="fsdp2",
        layout=Layout(reshard_after_forward=True),
        precision=Precision(dtype="bf16", recipe="mixed"),
    )
    assert mixed.with_(precision="fp32").precision == Precision()


def test_a_part_given_as_a_flat_value_is_refused_naming_the_part():
    with pytest.raises(TypeError, match=r"precision must be a Precision .*e\.g\. precision=Precision\(\)"):
        ParityConfig(engine="ddp", precision="bf16")  # type: ignore[arg-type]


def test_a_precision_compared_with_a_string_says_what_to_compare():
    with pytest.raises(TypeError, match=r"compare its dtype \(precision\.dtype == 'fp32'\)"):
        _ = Precision() == "fp32"


def test_each_part_checks_its_own_fields_naming_the_field():
    with pytest.raises(ValueError, match="clip=0.5 clips on path='unscale_clip' only"):
        Loop(clip=0.5)
    with pytest.raises(ValueError, match=r"scaler must be one of \('ours', 'torch'\)"):
        Scale(scaler="apex")
    with pytest.raises(ValueError, match="resume_method='dcp' needs resume_at"):
        ParityConfig(engine="ddp", resume=Resume(method="dcp"))
    with pytest.raises(ValueError, match="hsdp=2 is a 2-D mesh for engine='fsdp2'"):
        ParityConfig(engine="ddp", world_size=4, mesh=Mesh(hsdp=2))
