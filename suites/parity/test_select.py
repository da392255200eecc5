"""``-k`` expressions select configurations as pytest's ``-k`` selects tests."""

import pytest

from harness.parity.plan.matrices import default as matrix
from harness.parity.plan.select import ExpressionError, select

CONFIGS = matrix.default_matrix()


def ids(expression):
    return {c.id for c in select(CONFIGS, expression)}


def test_an_empty_expression_selects_everything():
    assert len(select(CONFIGS, "")) == len(CONFIGS)


def test_a_word_matches_a_substring_of_the_id():
    assert ids("shard_grad_op") == {c.id for c in CONFIGS if "shard_grad_op" in c.id}


def test_a_word_matches_a_field_keyword():
    assert ids("suite=sparse") == {c.id for c in CONFIGS if c.suite == "sparse"}


def test_and_or_not_and_parentheses_combine_as_in_pytest():
    got = ids("fsdp2 and (fp16 or bf16) and not offload")
    want = {
        c.id for c in CONFIGS if c.engine == "fsdp2" and c.precision.dtype != "fp32" and not c.layout.offload
    }
    assert got == want and got


def test_not_binds_tighter_than_and():
    assert ids("not fsdp1 and not fsdp2") == {c.id for c in CONFIGS if c.engine == "ddp"}


def test_matching_ignores_case():
    assert ids("FSDP2 and Reshard") == ids("fsdp2 and reshard")


@pytest.mark.parametrize(
    ("expression", "complaint"),
    [
        ("fsdp2 and", "a word or '(' is missing"),
        ("(fsdp2", "')' is missing"),
        ("fsdp2 bf16", "unexpected 'bf16'"),
    ],
)
def test_a_malformed_expression_names_the_problem_and_the_fix(expression, complaint):
    with pytest.raises(ExpressionError) as error:
        select(CONFIGS, expression)
    assert complaint in str(error.value) and "e.g. -k 'fsdp2 and not bf16'" in str(error.value)
