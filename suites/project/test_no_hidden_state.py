"""The parity engine (``harness/parity/``) keeps no hidden state (docs/architecture.md, section 4.7):
no module-level container that anything mutates, no ``global`` statement, no module-level memo
cache, and no write into another module's or object's internals, but for the documented exceptions
below, each with its reason.

Why a scan: state a module keeps for itself outlives the configuration, the rank call and the test
that set it, and what it changes shows up somewhere else (a flag toggled around one run, a dict
keyed by ``id()`` that a reused address hits). Such state is passed, or held by the object that
owns it (a run, an engine, a model's twin, the default group's stash: ``context.group_stash``).
The scan reads the sources (``ast``), imports nothing, and runs in ``make test``.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "harness" / "parity"
TORCH_PRIVATE = ROOT / "harness" / "torch_private"
"""Where the engine's reads of torch's internals and its one patch of torch live: scanned with it."""

ALLOWED: dict[tuple[str, str], str] = {
    ("workload/registry.py", "cache resolve"): (
        "a workload spec is resolved once per process: importing the user's module and calling its "
        "factory is the slow part, and the spec names the same workload for the process's life"
    ),
    ("workload/registry.py", "cache fused_optimizer"): (
        "whether a workload's own optimizer is fused: a probe optimizer built once per spec, as resolve"
    ),
    ("workload/registry.py", "inner.__dynamo_disable"): (
        "torch's add_param_group lent as itself for the one probe optimizer (_without_dynamo_disable), "
        "given back on leaving: its wrapper would import dynamo (1.3-1.6 s) before the first row"
    ),
    ("workload/items.py", "cache _count"): (
        "a step's count of items over every rank and microbatch, drawn once per (workload, seed, "
        "ranks, microbatches, step) in a process: every microbatch's loss of the step asks for it"
    ),
    ("ranks/truth/pieces.py", "dist.get_rank"): (
        "the ground truth's pieces each see the process they stand for (a loss or a sampler reading "
        "torch.distributed.get_rank() at call time), the whole batch a world of one; restored on "
        "leaving (pieces.as_process), no collective runs inside"
    ),
    ("ranks/truth/pieces.py", "dist.get_world_size"): (
        "as dist.get_rank: a loss dividing by the world size on top of DDP's average is a bug the "
        "stage must see (microbatch_scaling)"
    ),
    ("ranks/truth/lockstep.py", "module.forward"): (
        "the ground truth's own float64 copy's SyncBatchNorm normalizes by the statistics of a "
        "microbatch's pieces together: torch's refuses a CPU tensor under a process group and cannot "
        "all-reduce within one process; a forward hook cannot replace the forward"
    ),
    ("../torch_private/patches.py", "setattr"): (
        "the one patch of torch (patches.patched, for the staged check's capture): FSDP has no hook "
        "that sees gradients before it reduces them; the sites are declared with the torch versions "
        "read (torch_private.fsdp2.REDUCE, fsdp1.REDUCE) and checked against the installed torch by "
        "suites/parity/test_capture.py"
    ),
    ("ranks/sides/checkpoint.py", "unit.forward"): (
        "a unit's forward run under torch.utils.checkpoint, on the run's own model: torch's in-place "
        "API for it is private (torch.distributed._composable.checkpoint) and its wrapper renames "
        "every parameter; a forward hook cannot replace the forward"
    ),
    ("ranks/sides/optim/step_pieces.py", "optimizer.step"): (
        "a fused optimizer's step taken over the candidate's shards (step_pieces.mirror, on the "
        "reference's own optimizer): the scaler, the schedulers, the record and the anchor must keep "
        "reading that optimizer's full parameters and state, and torch has no hook that changes what "
        "a step iterates over; an LR scheduler wraps the same attribute the same way"
    ),
    ("ranks/sides/tp/mirror.py", "module.forward"): (
        "the twin's own modules compute as the TP plan splits them: a forward hook could only replace "
        "the output after the unsplit forward ran (other ops, other RNG draws), so no hook serves"
    ),
}
"""``(module below harness/parity/, what the scan names)``: why it stays."""

_CONTAINERS = {
    "dict",
    "list",
    "set",
    "bytearray",
    "defaultdict",
    "OrderedDict",
    "Counter",
    "deque",
    "WeakSet",
    "WeakKeyDictionary",
    "WeakValueDictionary",
}
_MUTATORS = {
    "append",
    "extend",
    "insert",
    "pop",
    "popitem",
    "remove",
    "clear",
    "update",
    "setdefault",
    "add",
    "discard",
    "sort",
    "reverse",
    "appendleft",
    "extendleft",
    "popleft",
    "__setitem__",
    "__delitem__",
}
_CACHES = {"cache", "lru_cache", "cached_property"}


def _is_container(value: ast.expr) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        return name in _CONTAINERS
    return False


def _root(node: ast.expr) -> ast.expr:
    """``x`` of ``x[...]``, ``x[...][...]``: what a subscript ultimately indexes."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return node


def _module_containers(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and _is_container(node.value):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and node.value is not None and _is_container(node.value):
            if isinstance(node.target, ast.Name):
                names.add(node.target.id)
    return names


def _imported_modules(tree: ast.Module) -> set[str]:
    """Local names bound to modules (``import x``, ``import x as y``, ``from pkg import module``:
    a lower-case name from a package counts, as the engine imports its modules so)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names |= {alias.asname or alias.name for alias in node.names if alias.name.islower()}
    return names


def _mutated_name(node: ast.AST) -> str | None:
    """The name a statement or call mutates in place, if it mutates one directly (``x[k] = v``,
    ``del x[k]``, ``x[k] += v``, ``x.append(v)``, ``x[k].append(v)``; ``module.x[k] = v``:
    ``module.x``)."""
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = [t for t in node.targets if isinstance(t, ast.Subscript)]
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target] if isinstance(node.target, ast.Subscript) else []
    elif isinstance(node, ast.Delete):
        targets = [t for t in node.targets if isinstance(t, ast.Subscript)]
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS:
        targets = [node.func.value]
    for target in targets:
        root = _root(target)
        if isinstance(root, ast.Name):
            return root.id
        if isinstance(root, ast.Attribute) and isinstance(root.value, ast.Name):
            return f"{root.value.id}.{root.attr}"
    return None


def _callable_like(value: ast.expr) -> bool:
    """Whether ``value`` may be a function (a name, an attribute, a lambda, a call's result), not a
    plain value (a constant, a literal, arithmetic): what replacing a method assigns."""
    return isinstance(value, (ast.Name, ast.Attribute, ast.Lambda, ast.Call))


def method_names(paths: list[Path]) -> set[str]:
    """The names of the methods the classes of ``paths`` define (properties left out: assigning one
    is what a setter is for)."""
    names = set()
    for path in paths:
        for cls in ast.walk(ast.parse(path.read_text())):
            if not isinstance(cls, ast.ClassDef):
                continue
            for node in cls.body:
                decorators = {ast.unparse(d).split(".")[-1] for d in getattr(node, "decorator_list", [])}
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not decorators & {
                    "property",
                    "setter",
                    "cached_property",
                }:
                    names.add(node.name)
    return names


def findings(
    path: Path, methods: AbstractSet[str] = frozenset(), elsewhere: AbstractSet[str] = frozenset()
) -> Iterator[tuple[str, int]]:
    """``(what, line)`` for each kind of hidden state in the module at ``path`` (``methods``: names
    an assignment to another object's attribute replaces a method by; ``elsewhere``: the names of
    the other modules' module-level containers)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    containers = _module_containers(tree)
    modules = _imported_modules(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            yield f"global {', '.join(node.names)}", node.lineno
        name = _mutated_name(node)
        owner_of, _, attribute_of = (name or "").rpartition(".")
        if name in containers or (owner_of in modules and attribute_of in elsewhere):
            yield f"mutated {name}", node.lineno
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node in tree.body:
            for decorator in node.decorator_list:
                called = decorator.func if isinstance(decorator, ast.Call) else decorator
                if (
                    called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", "")
                ) in _CACHES:
                    yield f"cache {node.name}", node.lineno
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
        ):
            yield node.func.id, node.lineno
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                if not isinstance(target, ast.Attribute) or not isinstance(target.value, ast.Name):
                    continue
                owner, attribute = target.value.id, target.attr
                if owner in ("self", "cls"):
                    continue
                if owner in modules:  # another module's attribute: a monkeypatch
                    yield f"{owner}.{attribute}", node.lineno
                elif attribute.startswith("_") or attribute == "forward":
                    yield f"{owner}.{attribute}", node.lineno  # another object's internals or forward
                elif attribute in methods and isinstance(node, ast.Assign) and _callable_like(node.value):
                    yield f"{owner}.{attribute}", node.lineno  # another object's method replaced


def _scan() -> dict[tuple[str, str], list[int]]:
    found: dict[tuple[str, str], list[int]] = {}
    paths = sorted([*ENGINE.rglob("*.py"), *TORCH_PRIVATE.rglob("*.py")])
    methods = method_names(paths)
    containers = {name for path in paths for name in _module_containers(ast.parse(path.read_text()))}
    for path in paths:
        for what, line in findings(path, methods, containers):
            key = os.path.relpath(path, ENGINE).replace(os.sep, "/")
            found.setdefault((key, what), []).append(line)
    return found


def test_the_engine_keeps_no_hidden_state_but_the_documented_exceptions():
    unexplained = {key: lines for key, lines in _scan().items() if key not in ALLOWED}
    assert not unexplained, (
        "hidden state in harness/parity/ (pass it, or hold it on its owner):\n"
        + "\n".join(
            f"  harness/parity/{module}:{','.join(map(str, lines))}: {what}"
            for (module, what), lines in sorted(unexplained.items())
        )
    )


def test_every_exception_is_still_there():
    assert not set(ALLOWED) - set(_scan()), "exceptions no longer needed: remove them from ALLOWED"


def test_the_scan_finds_each_kind_it_is_for(tmp_path):
    source = tmp_path / "planted.py"
    source.write_text(
        "import functools\n"
        "from harness.parity.ranks.sides import gather\n"
        "_flag = False\n"
        "_seen = {}\n"
        "_order = []\n"
        "_CONSTANT = {'a': 1}\n"
        "def toggle():\n"
        "    global _flag\n"
        "    _flag = not _flag\n"
        "def remember(x):\n"
        "    _seen[id(x)] = x\n"
        "    _order.append(x)\n"
        "    return _CONSTANT['a']\n"
        "@functools.cache\n"
        "def memo(spec):\n"
        "    return spec\n"
        "class Engine:\n"
        "    description = ''\n"
        "    def forward_rng(self, step):\n"
        "        return step\n"
        "def patch(hand, module, engine):\n"
        "    hand._add_reduced = print\n"
        "    gather.mesh = print\n"
        "    module.forward = print\n"
        "    engine.forward_rng = print\n"
        "    engine.description = 'fine: an attribute'\n"
        "    setattr(hand, 'x', 1)\n"
        "    gather._meshes.clear()\n"
    )
    assert sorted(what for what, _ in findings(source, method_names([source]), {"_meshes"})) == [
        "cache memo",
        "engine.forward_rng",
        "gather.mesh",
        "global _flag",
        "hand._add_reduced",
        "module.forward",
        "mutated _order",
        "mutated _seen",
        "mutated gather._meshes",
        "setattr",
    ]
