"""``-k`` expressions over configurations, as pytest's: ``fsdp2 and not bf16``, ``(sgd or adam) and w2``.

Why not pytest's own: the parity CLI runs without pytest (it is a dev dependency only). The
grammar is pytest's: ``or`` binds weakest, then ``and``, then ``not``; parentheses group; any other
word matches a configuration when it is a substring of the configuration's id or equals one of its
keywords (``engine=fsdp1``, ``suite=forced_inf``, ``every_rank``, ``fused`` ...; see
``ParityConfig.keywords``). Matching is case-insensitive.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from harness.parity.plan.config import ParityConfig

_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")
Predicate = Callable[[ParityConfig], bool]


class ExpressionError(ValueError):
    """A ``-k`` expression that does not parse; the message says where."""


def _tokens(expression: str) -> list[str]:
    tokens, position = [], 0
    expression = expression.strip()
    while position < len(expression):
        match = _TOKEN.match(expression, position)
        if match is None:  # pragma: no cover - the pattern matches any non-space run
            raise ExpressionError(f"cannot read -k {expression!r} at column {position + 1}")
        tokens.append(match.group(1))
        position = match.end()
    return tokens


def _word(word: str) -> Predicate:
    needle = word.lower()

    def matches(config: ParityConfig) -> bool:
        return needle in config.id.lower() or needle in {k.lower() for k in config.keywords}

    return matches


class _Parser:
    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.tokens = _tokens(expression)
        self.index = 0

    def fail(self, what: str) -> ExpressionError:
        where = " ".join(self.tokens[: self.index]) or "the start"
        return ExpressionError(
            f"-k {self.expression!r}: {what} after {where!r}; "
            "use words joined by 'and', 'or', 'not' and parentheses, e.g. -k 'fsdp2 and not bf16'"
        )

    def peek(self) -> str | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self) -> str:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def parse(self) -> Predicate:
        if not self.tokens:
            return lambda config: True
        predicate = self.disjunction()
        if self.peek() is not None:
            raise self.fail(f"unexpected {self.peek()!r}")
        return predicate

    def disjunction(self) -> Predicate:
        parts = [self.conjunction()]
        while self.peek() == "or":
            self.take()
            parts.append(self.conjunction())
        return parts[0] if len(parts) == 1 else (lambda c: any(p(c) for p in parts))

    def conjunction(self) -> Predicate:
        parts = [self.negation()]
        while self.peek() == "and":
            self.take()
            parts.append(self.negation())
        return parts[0] if len(parts) == 1 else (lambda c: all(p(c) for p in parts))

    def negation(self) -> Predicate:
        if self.peek() == "not":
            self.take()
            inner = self.negation()
            return lambda c: not inner(c)
        return self.atom()

    def atom(self) -> Predicate:
        token = self.peek()
        if token is None:
            raise self.fail("a word or '(' is missing")
        if token in ("and", "or", ")"):
            raise self.fail(f"unexpected {token!r}")
        self.take()
        if token == "(":
            inner = self.disjunction()
            if self.peek() != ")":
                raise self.fail("')' is missing")
            self.take()
            return inner
        return _word(token)


def compile_expression(expression: str) -> Predicate:
    """A predicate for ``expression``; an empty expression selects everything."""
    return _Parser(expression).parse()


def select(configs: Iterable[ParityConfig], expression: str) -> list[ParityConfig]:
    """The configurations ``expression`` selects, in their order."""
    predicate = compile_expression(expression)
    return [config for config in configs if predicate(config)]
