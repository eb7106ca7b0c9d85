"""`$filter`: lex, parse, type-check against the catalogue, compile once into closures.

The pipeline is text -> tokens -> syntax tree (untyped, with positions; filter_syntax.py)
-> bound tree (properties resolved to catalogue fields, literals converted to the field's
type; here) -> one predicate closure (here). Records are JSON-shaped and may be hostile: a
value that cannot be read as its field's type (edm_values.py) never matches and never raises.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from connectors.clinical_records.catalogue import Edm, EntitySet, Field
from connectors.sandbox.errors import ODataError, invalid_filter
from connectors.sandbox.odata.edm_values import COERCE, INVALID
from connectors.sandbox.odata.filter_syntax import (
    FLIPPED,
    LITERAL_NAMES,
    Binary,
    Call,
    Chain,
    Literal,
    Node,
    Parser,
    Prop,
    Unary,
)

Predicate = Callable[[dict], bool]

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
# and, for or-joined equalities on one field (`_compile_membership`), one set lookup
TYPED_OPS = {**COMPARE_OPS, "in": lambda value, allowed: value in allowed}


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
    compare, on_null = TYPED_OPS[op], op == "ne"

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
    if node.op == "and":
        return _balanced([compile_condition(part) for part in node.parts], True)
    equal: dict[str, tuple[Field, set[object]]] = {}  # field -> the literals it may equal
    rest = []
    for part in node.parts:
        if isinstance(part, Compare) and part.op == "eq" and part.value is not None:
            equal.setdefault(part.field.name, (part.field, set()))[1].add(part.value)
        else:
            rest.append(compile_condition(part))
    members = [_compile_membership(f, values) for f, values in equal.values()]
    return _balanced([*members, *rest], False)


def _compile_membership(fld: Field, values: set[object]) -> Predicate:
    """`f eq a or f eq b or ...` as one set lookup: a hundred keys or-joined in a request
    cost a hundred calls a row, and a scan of a million rows a minute."""
    name, allowed = fld.name, frozenset(values)
    if fld.type is Edm.STRING:
        return lambda record: type(value := record.get(name)) is str and value in allowed
    return _compile_typed(name, "in", allowed, COERCE[fld.type])


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
