"""harness.rank.context on its own: what a rank keeps for its default process group, and when it
is dropped."""

from __future__ import annotations

import pytest

from harness.rank import context


@pytest.fixture
def fresh_group(monkeypatch):
    """This process as if it had created its fifth default group (restored afterwards)."""
    monkeypatch.setattr(context, "_GROUP", context.GroupStash(5))


def test_the_stash_keeps_what_a_key_holds_until_a_new_group_is_created(fresh_group):
    key = context.GroupKey[list[int]]()
    kept = context.group_stash().setdefault(key, list)
    kept.append(1)
    assert context.group_stash().setdefault(key, list) is kept
    assert context.group_stash().get(key) == [1]
    context.advance_group_generation()
    assert context.group_generation() == 6
    assert context.group_stash().get(key) is None


def test_keys_are_apart_and_pop_drops_only_its_own(fresh_group):
    one, other = context.GroupKey[str](), context.GroupKey[str]()
    stash = context.group_stash()
    stash[one], stash[other] = "one", "other"
    assert stash.pop(one) == "one" and stash.pop(one) is None
    assert stash.get(other) == "other"
