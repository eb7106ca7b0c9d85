"""`$filter`'s text as a syntax tree: tokens with their positions, then the untyped tree the
binder (filter.py) resolves against the catalogue; every error names the position.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from connectors.sandbox.errors import ODataError, invalid_filter
from connectors.sandbox.odata.edm_values import INVALID, parse_date, parse_instant

# -- lexer -------------------------------------------------------------------------------------

_LITERAL_END = r"(?![\w.:+\-])"
_TOKEN = re.compile(
    rf"""
    (?P<ws>\s+)
    |(?P<string>'(?:[^']|'')*')
    |(?P<datetime>[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}[Tt][0-9]{{2}}:[0-9]{{2}}
        (?::[0-9]{{2}}(?:\.[0-9]+)?)?(?:[Zz]|[+-][0-9]{{2}}:[0-9]{{2}}){_LITERAL_END})
    |(?P<date>[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}{_LITERAL_END})
    |(?P<decimal>[+-]?[0-9]+\.[0-9]+{_LITERAL_END})
    |(?P<int>[+-]?[0-9]+{_LITERAL_END})
    |(?P<name>[A-Za-z_]\w*)
    |(?P<punct>[(),])
    |(?P<bad>'|[\w.:+\-]+|.)
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class Token:
    kind: str  # string, datetime, date, decimal, int, name, punct, end
    text: str
    pos: int


def syntax_error(detail: str) -> ODataError:
    return invalid_filter("Syntax error in $filter.", detail)


def tokenize(text: str) -> Iterator[Token]:
    """Tokens with their 0-based character positions, then one `end` token."""
    for match in _TOKEN.finditer(text):
        kind = match.lastgroup
        assert kind is not None
        if kind == "ws":
            continue
        if kind == "bad":
            if match.group() == "'":
                raise syntax_error(f"Unterminated string literal at position {match.start()}.")
            raise syntax_error(_bad_token(match.group(), match.start()))
        yield Token(kind, match.group(), match.start())
    yield Token("end", "", len(text))


def _bad_token(text: str, pos: int) -> str:
    if _NAIVE_DATETIME.match(text):
        return (
            f"Invalid date-time literal '{text}' at position {pos}: write ISO 8601 with an "
            "offset or Z, for example 2024-01-31T09:30:00Z."
        )
    return f"Invalid token '{text}' at position {pos}."


_NAIVE_DATETIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt]")

# -- syntax tree -------------------------------------------------------------------------------

COMPARISONS = ("eq", "ne", "gt", "ge", "lt", "le")
FLIPPED = {"eq": "eq", "ne": "ne", "gt": "lt", "ge": "le", "lt": "gt", "le": "ge"}
KEYWORD_LITERALS: dict[str, object] = {"true": True, "false": False, "null": None}


@dataclass(frozen=True)
class Literal:
    kind: str  # a token kind, or "boolean" / "null"
    value: object
    text: str
    pos: int


@dataclass(frozen=True)
class Prop:
    name: str
    pos: int


@dataclass(frozen=True)
class Call:
    name: str
    args: tuple[Node, ...]
    pos: int


@dataclass(frozen=True)
class Unary:
    op: str  # "not"
    operand: Node
    pos: int


@dataclass(frozen=True)
class Binary:
    op: str  # a comparison
    left: Node
    right: Node
    pos: int


@dataclass(frozen=True)
class Chain:
    """`a or b or c`: one flat node, so a long chain costs no recursion anywhere."""

    op: str  # "and" / "or"
    operands: tuple[Node, ...]


Node = Literal | Prop | Call | Unary | Binary | Chain
# Parentheses, `not` and calls nest at most this deep: deeper would exhaust Python's stack
# (a 500) long before it meant anything; the spec sets no limit, so the error explains.
MAX_NESTING = 100


def _int_literal(text: str) -> int | Any:
    try:
        return int(text)
    except ValueError:  # more digits than Python converts (4,300)
        return INVALID


LITERAL_NAMES = {
    "string": "a string",
    "int": "an integer",
    "decimal": "a decimal",
    "boolean": "a boolean",
    "date": "a date",
    "datetime": "a date-time",
    "null": "null",
}

LITERAL_VALUES: dict[str, Callable[[str], object]] = {
    "string": lambda text: text[1:-1].replace("''", "'"),
    "int": _int_literal,
    "decimal": Decimal,
    "date": parse_date,
    "datetime": parse_instant,
}


class Parser:
    """Recursive descent; precedence, loosest first: or, and, comparison, not."""

    def __init__(self, text: str) -> None:
        self.tokens = list(tokenize(text))
        self.index = 0
        self.depth = 0

    @property
    def peek(self) -> Token:
        return self.tokens[self.index]

    def take(self) -> Token:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def at(self, kind: str, *texts: str) -> bool:
        return self.peek.kind == kind and (not texts or self.peek.text in texts)

    def expect(self, kind: str, text: str) -> Token:
        if not self.at(kind, text):
            raise unexpected(self.peek, f"expected '{text}'")
        return self.take()

    def parse(self) -> Node:
        node = self.disjunction()
        if not self.at("end"):
            raise unexpected(self.peek, "expected 'and', 'or' or the end")
        return node

    def disjunction(self) -> Node:
        return self._chain(("or",), self.conjunction)

    def conjunction(self) -> Node:
        return self._chain(("and",), self.comparison)

    def _chain(self, ops: tuple[str, ...], operand: Callable[[], Node]) -> Node:
        operands, op = [operand()], ""
        while self.at("name", *ops):
            op = self.take().text
            operands.append(operand())
        return operands[0] if len(operands) == 1 else Chain(op, tuple(operands))

    @contextmanager
    def _nested(self, token: Token) -> Iterator[None]:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise syntax_error(
                f"Parentheses, 'not' and calls nest deeper than {MAX_NESTING} levels "
                f"at position {token.pos}."
            )
        yield
        self.depth -= 1

    def comparison(self) -> Node:
        left = self.unary()
        if not self.at("name", *COMPARISONS):
            return left
        token = self.take()
        return Binary(token.text, left, self.unary(), token.pos)

    def unary(self) -> Node:
        if self.at("name", "not"):
            token = self.take()
            with self._nested(token):
                return Unary("not", self.unary(), token.pos)
        return self.primary()

    def primary(self) -> Node:
        token = self.take()
        if token.kind == "punct" and token.text == "(":
            with self._nested(token):
                node = self.disjunction()
                self.expect("punct", ")")
                return node
        if token.kind in LITERAL_VALUES:
            value = LITERAL_VALUES[token.kind](token.text)
            if value is INVALID:
                word = LITERAL_NAMES[token.kind].split(" ", 1)[1]
                raise syntax_error(f"Invalid {word} '{token.text}' at position {token.pos}.")
            return Literal(token.kind, value, token.text, token.pos)
        if token.kind == "name" and token.text in KEYWORD_LITERALS:
            value = KEYWORD_LITERALS[token.text]
            return Literal("null" if value is None else "boolean", value, token.text, token.pos)
        if token.kind == "name" and token.text not in RESERVED:
            if self.at("punct", "("):
                return self.call(token)
            return Prop(token.text, token.pos)
        raise unexpected(token, "expected a property, a literal, 'not' or '('")

    def call(self, name: Token) -> Call:
        with self._nested(self.take()):
            args = [self.disjunction()]
            while self.at("punct", ","):
                self.take()
                args.append(self.disjunction())
            self.expect("punct", ")")
            return Call(name.text, tuple(args), name.pos)


RESERVED = frozenset({*COMPARISONS, "and", "or", "not"})


def unexpected(token: Token, hint: str) -> ODataError:
    if token.kind == "end":
        return syntax_error(f"Unexpected end of expression at position {token.pos}; {hint}.")
    return syntax_error(f"Unexpected token '{token.text}' at position {token.pos}; {hint}.")
