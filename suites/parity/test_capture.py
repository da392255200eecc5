"""The staged check's one patch of torch (``ranks/sides/capture.py``): the private FSDP functions it
replaces for one backward are still what it read in torch's sources, and are always put back.

Why a test of torch: torch offers no hook that sees FSDP's gradients before it reduces them, so
the capture replaces private functions (``capture.PATCH_SITES``). A torch that renames one, takes
other arguments, or stops calling it by its module-level name would silently capture nothing; this
fails first, naming the site and what changed."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from harness.parity.ranks.sides import capture
from harness.torch_private import patches


def test_every_torch_function_the_capture_replaces_is_still_as_it_was_read():
    assert capture.torch_differs() == []


def test_the_sites_are_fsdp2s_reduction_and_fsdp1s_two():
    assert [(site.module.rsplit(".", 1)[1], site.name) for site in capture.PATCH_SITES] == [
        ("_fsdp_param_group", "foreach_reduce"),
        ("_runtime_utils", "_reduce_grad"),
        ("_runtime_utils", "_reduce_grad_no_shard"),
    ]


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"parameters": ("grads", "params")}, "its parameters begin ('fsdp_params', 'unsharded_grads')"),
        ({"name": "foreach_reduce_v2"}, "has no attribute 'foreach_reduce_v2'"),
        (
            {"called_from": "FSDPParamGroup.pre_forward"},
            "no longer calls it by name; the patch would not be reached",
        ),
        (
            {
                "reads": (
                    ("torch.distributed.fsdp._fully_shard._fsdp_param", "FSDPParam.__init__", ("_fqn",)),
                )
            },
            "no longer sets ['_fqn'], which the recording reads",
        ),
    ],
    ids=["signature", "renamed", "not-called-by-name", "attribute-gone"],
)
def test_a_torch_that_changed_a_site_is_named_with_both_versions(monkeypatch, change, said):
    site = dataclasses.replace(capture.PATCH_SITES[0], **change)
    monkeypatch.setattr(capture, "PATCH_SITES", (site,))
    (found,) = capture.torch_differs()
    assert found.startswith(f"{site.module}.{site.name} (read in torch 2.11, 2.12, 2.13, 2.14, installed ")
    assert said in found, found


def test_a_patched_function_is_put_back_even_when_the_block_raises():
    site = capture.PATCH_SITES[1]
    module = importlib.import_module(site.module)
    original = getattr(module, site.name)
    with pytest.raises(RuntimeError, match="inside"), patches.patched(site, lambda original: "replaced"):
        assert getattr(module, site.name) == "replaced"
        raise RuntimeError("inside")
    assert getattr(module, site.name) is original
