"""Every private torch API that ``harness/`` and ``scaler/`` use lives in the adapters
(``harness/torch_private/``, ``scaler/_torch_private.py``), each saying which torch versions it was
read from.

Why a scan: a private torch name used anywhere else breaks on the next torch without anyone having
looked (torch 2.11 broke every FSDP2 row on one such import in the twin). The scan reads the
sources (``ast``) and imports nothing of the project. It finds, outside the adapters:

* an import of a private torch module or name (``from torch.distributed.fsdp._common_utils
  import ...``, ``import torch._dynamo``);
* an attribute chain rooted at torch, through any alias the file imported (``torch._utils.x``,
  ``dist.distributed_c10d._get_default_store``, ``DDP._set_params_...``), except ATen operators in
  the ``torch`` namespace (``torch._foreach_*``, ``torch._amp_*``: the dispatcher's operators,
  whose schema torch versions itself);
* a string naming a private torch module (what ``importlib`` or a patch would reach);
* a read of a private attribute of a torch object that an adapter encapsulates
  (:data:`ADAPTED_ATTRIBUTES`: ``module._handle``, ``fsdp_param._module_info``, ...).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = (ROOT / "harness" / "torch_private", ROOT / "scaler" / "_torch_private.py")
SCANNED = (ROOT / "harness", ROOT / "scaler")

ADAPTED_ATTRIBUTES = frozenset(
    {
        # FSDP1 (torch_private.fsdp1)
        "_handle",
        "_fqns",
        "_shapes",
        "_numels_with_padding",
        "_is_padding_mask",
        "_shard_param_infos",
        "_unpadded_unsharded_size",
        # FSDP2 (torch_private.fsdp2)
        "_get_fsdp_state",
        "_fsdp_param_group",
        "_fsdp_param_groups",
        "_mesh_info",
        "_mp_policy",
        "_module_info",
        "_param_fqn",
        "_reduce_scatter_comm",
        "_all_reduce_hook",
        # pipelining, dynamo, checkpointing, DTensor, sharded tensors
        "_stages",
        "_n_microbatches",
        "_orig_mod",
        "_torchdynamo_orig_backend",
        "_forward_pre_hooks",
        "_op_dispatcher",
        "_local_tensor",
        "_init_from_local_shards_and_global_metadata",
    }
)
"""Private attributes of torch objects (not reachable through a module path) that an adapter reads
for everyone else."""

_MODULE_PATH = re.compile(r"^torch(\.\w+)+$")


def _private(segment: str) -> bool:
    return segment.startswith("_") and not segment.startswith("__")


def _aten_operator(path: str) -> bool:
    """``torch._name`` where ``_name`` is an ATen operator (``torch._foreach_mul_``)."""
    parts = path.split(".")
    return len(parts) == 2 and parts[0] == "torch" and hasattr(torch.ops.aten, parts[1])


def _first_private(path: str) -> str | None:
    """``path`` cut after its first private segment, or ``None`` if it has none."""
    parts = path.split(".")
    for index, part in enumerate(parts[1:], start=1):
        if _private(part):
            found = ".".join(parts[: index + 1])
            return None if _aten_operator(found) else found
    return None


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Each local name a torch import binds, and the dotted torch path it stands for."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    if alias.asname:
                        found[alias.asname] = alias.name
                    else:
                        found[alias.name.split(".")[0]] = "torch"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            for alias in node.names:
                found[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return found


def _chain(node: ast.Attribute) -> tuple[str, list[str]] | None:
    """``(root name, [attributes...])`` of ``a.b.c``; ``None`` when the root is not a name."""
    parts: list[str] = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        parts.append(current.attr)
        current = current.value
    if not isinstance(current, ast.Name):
        return None
    return current.id, list(reversed(parts))


def private_uses(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for every private torch use in ``source`` (the module docstring's kinds)."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    found: set[tuple[int, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch" and (hit := _first_private(alias.name)):
                    found.add((node.lineno, f"import {hit}"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            for alias in node.names:
                if hit := _first_private(f"{node.module}.{alias.name}"):
                    found.add((node.lineno, f"import {hit}"))
        elif isinstance(node, ast.Attribute):
            chain = _chain(node)
            if chain is not None and chain[0] in aliases:
                if hit := _first_private(".".join([aliases[chain[0]], *chain[1]])):
                    found.add((node.lineno, hit))
            elif node.attr in ADAPTED_ATTRIBUTES and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            ):
                found.add((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _MODULE_PATH.match(node.value) and (hit := _first_private(node.value)):
                found.add((node.lineno, f"{hit!r}"))
    return sorted(found)


def _scanned() -> list[Path]:
    paths = [p for root in SCANNED for p in root.rglob("*.py")]
    return sorted(p for p in paths if not any(p == a or a in p.parents for a in ADAPTERS))


def test_private_torch_apis_are_used_only_through_the_adapters():
    found = [
        f"  {path.relative_to(ROOT)}:{line}: {what}"
        for path in _scanned()
        for line, what in private_uses(path.read_text())
    ]
    assert not found, (
        "private torch APIs used outside harness/torch_private/ and scaler/_torch_private.py "
        "(move each into the adapter of its concern, saying which torch versions it was read from):\n"
        + "\n".join(found)
    )


def test_every_adapter_says_which_torch_versions_it_was_read_from():
    modules = [p for a in ADAPTERS for p in ([a] if a.is_file() else sorted(a.glob("*.py")))]
    silent = [
        str(p.relative_to(ROOT))
        for p in modules
        if p.name not in ("__init__.py", "patches.py")
        and "2.11, 2.12, 2.13 and 2.14" not in (ast.get_docstring(ast.parse(p.read_text())) or "")
    ]
    assert not silent, f"adapters whose docstring does not name the torch versions read: {silent}"


@pytest.mark.parametrize(
    ("line", "what"),
    [
        (
            "from torch.distributed.fsdp._common_utils import collect_grad_tensors",
            "import torch.distributed.fsdp._common_utils",
        ),
        ("import torch._dynamo", "import torch._dynamo"),
        ("import torch\nx = torch._utils._flatten_dense_tensors", "torch._utils"),
        (
            "import torch.distributed as dist\ndist.distributed_c10d._get_default_store()",
            "torch.distributed.distributed_c10d._get_default_store",
        ),
        (
            "from torch.nn.parallel import DistributedDataParallel as DDP\nDDP._set_x(m)",
            "torch.nn.parallel.DistributedDataParallel._set_x",
        ),
        ("import torch\nf = torch._C._group_tensors_by_device_and_dtype", "torch._C"),
        ("NAME = 'torch.testing._internal.common_distributed'", "'torch.testing._internal'"),
        ("handle = module._handle", "._handle"),
        ("info = fsdp_param._module_info", "._module_info"),
    ],
    ids=[
        "from-import",
        "import",
        "attribute",
        "alias",
        "class-alias",
        "torch._C",
        "string",
        "object-attr",
        "fsdp2-attr",
    ],
)
def test_the_scan_finds_each_kind_of_private_use(line, what):
    assert [found for _, found in private_uses(line)] == [what]


@pytest.mark.parametrize(
    "line",
    [
        "import torch\ntorch._amp_update_scale_(a, b, c, 2.0, 0.5, 2000)",
        "import torch\ntorch._foreach_mul_(xs, 2.0)",
        "self._handle = None",
        "from torch.distributed.fsdp import fully_shard",
        "x = obj._private_of_our_own",
    ],
    ids=["aten-amp", "aten-foreach", "own-attribute", "public-import", "unlisted-attribute"],
)
def test_the_scan_leaves_aten_operators_and_our_own_names_alone(line):
    assert private_uses(line) == []
