"""``torch.distributed`` internals the harness uses around its own process groups: the default
group's store, a new timeout for the groups that exist, and torch's test-skip exit codes.

Read from torch 2.11, 2.12, 2.13 and 2.14 (``distributed_c10d.py``,
``torch/testing/_internal/common_distributed.py``): the same.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any

SKIP_CODES_MODULE = "torch.testing._internal.common_distributed"
"""Where torch's distributed test decorators keep ``TEST_SKIPS`` (their exit codes and messages)."""


def default_store() -> Any:
    """The store the default process group was made with (``_get_default_store``)."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


def set_timeout(timeout: timedelta) -> None:
    """Set the collective timeout of the default group and every group made from it
    (``_set_pg_timeout``)."""
    from torch.distributed import distributed_c10d

    distributed_c10d._set_pg_timeout(timeout)


def test_skip_message(code: Any) -> str | None:
    """The message of torch's test-skip exit ``code`` (a rank of a ``MultiProcessTestCase`` test
    ends with ``sys.exit(code)`` to skip), or ``None``; only if that test module was imported."""
    module = sys.modules.get(SKIP_CODES_MODULE)
    for skip in getattr(module, "TEST_SKIPS", {}).values():
        if code == skip.exit_code:
            return str(skip.message)
    return None
