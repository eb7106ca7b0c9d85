"""`$filter`: lex, parse, type-check against the catalogue, compile once into closures.

The pipeline is text -> tokens -> syntax tree (untyped, with positions) -> bound tree
(properties resolved to catalogue fields, literals converted to the field's type) ->
one predicate closure. Records are JSON-shaped and may be hostile: a value that cannot be
read as its field's type never matches and never raises.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from functools import lru_cache
from typing import Any

from connectors.clinical_records.catalogue import Edm, EntitySet, Field
from connectors.sandbox.errors import ODataError, invalid_filter

Predicate = Callable[[dict], bool]

# -- values: literals and record values read as their Edm type ---------------------------------

INVALID: Any = type("Invalid", (), {"__repr__": lambda self: "INVALID"})()
"""A record value that cannot be read as its field's type: it matches nothing."""

_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_INSTANT = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2})"
    r"(?::([0-9]{2})(?:\.([0-9]+))?)?(?:[Zz]|([+-])([0-9]{2}):?([0-9]{2}))"
)
_DECIMAL = re.compile(r"[+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+")
_EPOCH = datetime(1970, 1, 1)
_CACHE = 1 << 18

Instant = tuple[int, str]
"""(UTC epoch seconds, fraction digits without trailing zeros): exact, and orders as time."""


@lru_cache(maxsize=_CACHE)
def parse_instant(text: str) -> Instant | Any:
    """An ISO 8601 date-time with offset as an exact comparable instant, or INVALID."""
    match = _INSTANT.fullmatch(text)
    if match is None:
        return INVALID
    year, month, day, hour, minute, second, fraction, sign, off_h, off_m = match.groups()
    try:
        local = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second or 0))
    except ValueError:
        return INVALID
    offset = 0
    if sign:
        if int(off_h) > 23 or int(off_m) > 59:
            return INVALID
        offset = (int(off_h) * 3600 + int(off_m) * 60) * (1 if sign == "+" else -1)
    delta = local - _EPOCH
    return (delta.days * 86400 + delta.seconds - offset, (fraction or "").rstrip("0"))


@lru_cache(maxsize=_CACHE)
def parse_date(text: str) -> date | Any:
    match = _DATE.fullmatch(text)
    if match is None:
        return INVALID
    try:
        return date(*map(int, match.groups()))
    except ValueError:
        return INVALID


@lru_cache(maxsize=_CACHE)
def parse_decimal(text: str) -> Decimal | Any:
    return Decimal(text) if _DECIMAL.fullmatch(text) else INVALID


def _typed(kind: type) -> Callable[[object], object]:
    """Exact type test: bool is an int in Python, but not in Edm.Int32."""
    return lambda value: value if type(value) is kind else INVALID


def _via_text(parse: Callable[[str], object]) -> Callable[[object], object]:
    return lambda value: parse(value) if type(value) is str else INVALID


def _as_decimal(value: object) -> object:
    kind = type(value)
    if kind is str:
        return parse_decimal(value)
    if kind is int:
        return Decimal(value)
    if kind is float and value == value and abs(value) != float("inf"):  # type: ignore[operator]
        return Decimal(repr(value))
    return INVALID


COERCE: dict[Edm, Callable[[object], object]] = {
    Edm.STRING: _typed(str),
    Edm.INT32: _typed(int),
    Edm.BOOLEAN: _typed(bool),
    Edm.DECIMAL: _as_decimal,
    Edm.DATE: _via_text(parse_date),
    Edm.DATETIME: _via_text(parse_instant),
}
"""Read a (non-null) record value as its field's Edm type, or INVALID."""


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


# -- bound tree: fields resolved, literals typed ----------------------------------------------


@dataclass(frozen=True)
class Compare:
    field: Field
    op: str
    value: object  # already in the field's comparable form; None for null


@dataclass(frozen=True)
class TextMatch:
    field: Field
    function: str
    text: str


@dataclass(frozen=True)
class IsTrue:
    field: Field  # a bare Edm.Boolean property used as a condition


@dataclass(frozen=True)
class Constant:
    value: bool


@dataclass(frozen=True)
class Not:
    operand: Condition


@dataclass(frozen=True)
class Junction:
    op: str  # "and" / "or"
    parts: tuple[Condition, ...]


Condition = Compare | TextMatch | IsTrue | Constant | Not | Junction

# Which literal kinds each Edm type accepts, and how the literal becomes comparable.
ACCEPTS: dict[Edm, dict[str, Callable[[Any], object]]] = {
    Edm.STRING: {"string": str},
    Edm.INT32: {"int": int},
    Edm.DECIMAL: {"int": Decimal, "decimal": Decimal},
    Edm.BOOLEAN: {"boolean": bool},
    Edm.DATE: {"date": lambda value: value},
    Edm.DATETIME: {"datetime": lambda value: value},
}
LITERAL_NAMES = {
    "string": "a string",
    "int": "an integer",
    "decimal": "a decimal",
    "boolean": "a boolean",
    "date": "a date",
    "datetime": "a date-time",
    "null": "null",
}
TEXT_FUNCTIONS: dict[str, Callable[[str, str], bool]] = {
    "startswith": str.startswith,
    "endswith": str.endswith,
    "contains": operator.contains,
}


def type_error(detail: str) -> ODataError:
    return invalid_filter("Type error in $filter.", detail)


def resolve(entity: EntitySet, prop: Prop) -> Field:
    found = entity.by_name.get(prop.name)
    if found is None:
        raise invalid_filter(
            "Unknown property in $filter.",
            f"Property '{prop.name}' does not exist on type '{entity.qualified_type}'.",
        )
    return found


def bind(node: Node, entity: EntitySet) -> Condition:
    """Type-check a syntax tree as a boolean condition on `entity`."""
    if isinstance(node, Chain):
        return Junction(node.op, tuple(bind(operand, entity) for operand in node.operands))
    if isinstance(node, Binary):
        return bind_comparison(node, entity)
    if isinstance(node, Unary):
        return Not(bind(node.operand, entity))
    if isinstance(node, Call):
        return bind_call(node, entity)
    if isinstance(node, Prop):
        found = resolve(entity, node)
        if found.type is not Edm.BOOLEAN:
            raise type_error(
                f"Property '{found.name}' of type '{found.type.value}' is not a condition; "
                "compare it with a value."
            )
        return IsTrue(found)
    if node.kind == "boolean":
        return Constant(bool(node.value))
    raise type_error(f"The literal {node.text} at position {node.pos} is not a condition.")


def bind_comparison(node: Binary, entity: EntitySet) -> Compare:
    left, op, right = node.left, node.op, node.right
    if isinstance(left, Literal) and isinstance(right, Prop):
        left, op, right = right, FLIPPED[op], left
    if isinstance(left, Unary):
        raise type_error(
            f"'not' binds tighter than '{op}' (position {left.pos}): "
            f"write not (... {op} ...) to negate a comparison."
        )
    if not (isinstance(left, Prop) and isinstance(right, Literal)):
        raise type_error(
            f"The comparison '{op}' at position {node.pos} needs a property on one side "
            "and a literal on the other."
        )
    found = resolve(entity, left)
    if right.kind == "null":
        return Compare(found, op, None)
    convert = ACCEPTS[found.type].get(right.kind)
    if convert is None:
        raise type_error(
            f"Property '{found.name}' of type '{found.type.value}' cannot be compared with "
            f"{LITERAL_NAMES[right.kind]} literal ({right.text})."
        )
    return Compare(found, op, convert(right.value))


def bind_call(node: Call, entity: EntitySet) -> TextMatch:
    if node.name not in TEXT_FUNCTIONS:
        known = ", ".join(TEXT_FUNCTIONS)
        raise type_error(f"Unknown function '{node.name}'; supported: {known}.")
    usage = f"{node.name}(property,'text')"
    if len(node.args) != 2:
        raise type_error(f"{node.name} takes two arguments: {usage}.")
    target, text = node.args
    if not (isinstance(target, Prop) and isinstance(text, Literal) and text.kind == "string"):
        raise type_error(f"{node.name} takes a property and a string literal: {usage}.")
    found = resolve(entity, target)
    if found.type is not Edm.STRING:
        raise type_error(
            f"{node.name} needs an Edm.String property; '{found.name}' is '{found.type.value}'."
        )
    return TextMatch(found, node.name, str(text.value))


# -- compile: one closure per node, built once ------------------------------------------------

ORDERING = {"gt": operator.gt, "ge": operator.ge, "lt": operator.lt, "le": operator.le}
COMPARE_OPS = {"eq": operator.eq, "ne": operator.ne, **ORDERING}


def compile_condition(condition: Condition) -> Predicate:
    return COMPILERS[type(condition)](condition)


def _compile_compare(node: Compare) -> Predicate:
    name, op, literal = node.field.name, node.op, node.value
    if literal is None:
        return _compile_null(name, op)
    if op in ORDERING or node.field.type is not Edm.STRING:
        return _compile_typed(name, op, literal, COERCE[node.field.type])
    if op == "eq":  # the hot path of string equality: no coercion needed
        return lambda record: record.get(name) == literal
    return lambda record: (
        (value := record.get(name)) is None or (type(value) is str and value != literal)
    )


def _compile_typed(name: str, op: str, literal: object, coerce: Callable) -> Predicate:
    """null matches only `ne`; a value unreadable as the field's type matches nothing."""
    compare, on_null = COMPARE_OPS[op], op == "ne"

    def test(record: dict) -> bool:
        value = record.get(name)
        if value is None:
            return on_null
        value = coerce(value)
        return value is not INVALID and compare(value, literal)

    return test


def _compile_null(name: str, op: str) -> Predicate:
    if op == "eq":
        return lambda record: record.get(name) is None
    if op == "ne":
        return lambda record: record.get(name) is not None
    return lambda record: False  # ordering against null is never true


def _compile_text(node: TextMatch) -> Predicate:
    name, test, text = node.field.name, TEXT_FUNCTIONS[node.function], node.text
    return lambda record: type(value := record.get(name)) is str and test(value, text)


def _compile_junction(node: Junction) -> Predicate:
    return _balanced([compile_condition(part) for part in node.parts], node.op == "and")


def _balanced(parts: list[Predicate], conjunction: bool) -> Predicate:
    """Closures paired as a balanced tree: a chain of n parts nests log2(n) calls deep
    (a linear chain overflowed Python's stack) and runs as fast as one `a and b`."""
    if len(parts) == 1:
        return parts[0]
    half = len(parts) // 2
    left, right = _balanced(parts[:half], conjunction), _balanced(parts[half:], conjunction)
    if conjunction:
        return lambda record: left(record) and right(record)
    return lambda record: left(record) or right(record)


def _compile_not(node: Not) -> Predicate:
    inner = compile_condition(node.operand)
    return lambda record: not inner(record)


def _compile_is_true(node: IsTrue) -> Predicate:
    name = node.field.name
    return lambda record: record.get(name) is True


def _compile_constant(node: Constant) -> Predicate:
    value = node.value
    return lambda record: value


COMPILERS: dict[type, Callable[[Any], Predicate]] = {
    Compare: _compile_compare,
    TextMatch: _compile_text,
    Junction: _compile_junction,
    Not: _compile_not,
    IsTrue: _compile_is_true,
    Constant: _compile_constant,
}


# -- the public object -------------------------------------------------------------------------


@dataclass(frozen=True)
class Expr:
    """A parsed, type-checked and compiled `$filter`; call it on a record to test it."""

    text: str
    condition: Condition
    predicate: Predicate = field(repr=False, compare=False, hash=False)

    def __call__(self, record: dict) -> bool:
        return self.predicate(record)

    def uses_or(self) -> bool:
        """Whether an `or` appears anywhere in it (SandboxConfig.refuse_filter_or)."""
        pending = [self.condition]
        while pending:
            condition = pending.pop()
            if isinstance(condition, Junction):
                if condition.op == "or":
                    return True
                pending.extend(condition.parts)
            elif isinstance(condition, Not):
                pending.append(condition.operand)
        return False

    def conjuncts(self) -> tuple[Condition, ...]:
        """The top-level `and` parts: each must hold for a record to match."""
        return tuple(_flatten_and(self.condition))


def _flatten_and(condition: Condition) -> Iterator[Condition]:
    if isinstance(condition, Junction) and condition.op == "and":
        for part in condition.parts:
            yield from _flatten_and(part)
    else:
        yield condition


def parse_filter(text: str, entity: EntitySet) -> Expr:
    """Parse and type-check `text` against `entity`; raises InvalidFilter (400)."""
    if not text.strip():
        raise invalid_filter("Empty $filter.", "The $filter option needs an expression.")
    condition = bind(Parser(text).parse(), entity)
    return Expr(text, condition, compile_condition(condition))
