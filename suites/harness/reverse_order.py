"""A pytest plugin for the order self-test (``-p reverse_order``, not collected): run the collected
tests in reverse order, so a test that only passes after another one has run shows up."""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.reverse()
