"""The `wide` profile's moments (wide.py): dates, times and date-times in every form their
spec type allows, edges included; strings that name a moment without a stated format; and the
cursors, whose text changes form but never the instant it names.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from connectors.clinical_records.catalogue import Edm, Field
from connectors.sandbox import columns
from connectors.sandbox.columns import (
    Column,
    Context,
    bulk_edit,
    update_instants,
)
from connectors.sandbox.value_text import hhmmss, iso_dates, pick

EDGE_SHARE = 0.03  # values replaced by an edge of their type
LOOSE_TEXTS = ("unknown", "10/01/2026", "Oct 1, 2026", "1 Oct 2026 10:00", "2026-10", "N/A")
LOOSE_TIMES = ("09:30", "9:30 AM", "09:30 PM", "14:00:00", "2pm", "noon", "24:00", "7:05", "")


# -- dates and times --------------------------------------------------------------------------

# Offsets in seconds; 0 is written "Z", "z" or "+00:00".
OFFSETS = np.array([0, 0, 0, 19800, 20700, -28800, -12600, 50400, -43200, 3600, -18000])
UTC_TEXTS = ("Z", "z", "+00:00")
FRACTION_DIGITS = np.arange(10)
FRACTION_WEIGHTS = [0.4, 0.08, 0.08, 0.1, 0.04, 0.04, 0.12, 0.04, 0.04, 0.06]
DATE_EDGES = ("0001-01-01", "9999-12-31", "2000-02-29", "2024-02-29", "1900-03-01", "1970-01-01")
INSTANT_EDGES = ("0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999999Z", "1970-01-01T00:00Z")
TIME_EDGES = ("00:00:00", "23:59:59", "24:00:00")


def offset_text(seconds: int, utc_style: int) -> str:
    if seconds == 0:
        return UTC_TEXTS[utc_style]
    sign = "+" if seconds > 0 else "-"
    hours, minutes = divmod(abs(seconds) // 60, 60)
    return f"{sign}{hours:02d}:{minutes:02d}"


OFFSET_TEXTS = {
    (seconds, style): offset_text(seconds, style)
    for seconds in set(OFFSETS.tolist())
    for style in range(len(UTC_TEXTS))
}


def instant_texts(rng: np.random.Generator, seconds: np.ndarray) -> list[str]:
    """Each instant in one of its ISO 8601 forms: an offset, a fraction of 0 to 9 digits (digits
    after the second, so never earlier than the instant), no seconds where they are zero."""
    n = len(seconds)
    offsets = rng.choice(OFFSETS, n)
    utc_styles = rng.integers(0, len(UTC_TEXTS), n).tolist()
    lower_t = (rng.random(n) < 0.1).tolist()
    digits = rng.choice(FRACTION_DIGITS, n, p=FRACTION_WEIGHTS).tolist()
    fractions = rng.integers(1, 10**9, n).tolist()
    drop_seconds = (rng.random(n) < 0.5).tolist()
    local = np.datetime_as_string((seconds + offsets).astype("datetime64[s]"), unit="s").tolist()
    out = []
    for text, offset, utc, lower, k, fraction, drop in zip(
        local, offsets.tolist(), utc_styles, lower_t, digits, fractions, drop_seconds, strict=True
    ):
        body = text[:10] + ("t" if lower else "T") + text[11:]
        if k:
            body += "." + f"{fraction:09d}"[:k]
        elif drop and body.endswith(":00"):
            body = body[:-3]
        out.append(body + OFFSET_TEXTS[offset, utc])
    return out


def minutes_sometimes(ctx: Context, seconds: np.ndarray) -> np.ndarray:
    """A fifth of the instants on a whole minute, so `T10:00Z` shows up (non-cursor fields)."""
    whole = ctx.rng.random(len(seconds)) < 0.2
    return np.where(whole, seconds // 60 * 60, seconds)


def instants(ctx: Context, fld: Field) -> Column:
    texts = instant_texts(ctx.rng, minutes_sometimes(ctx, ctx.times()))
    return with_edges(ctx, texts, INSTANT_EDGES)


def dates(ctx: Context, fld: Field) -> Column:
    """Dates of the last century and the next decade, and the type's edges."""
    span = 100 * 365 * 86400
    seconds = ctx.rng.uniform(ctx.now - span, ctx.now + span / 10, ctx.n)
    return with_edges(ctx, iso_dates(seconds), DATE_EDGES)


def times(ctx: Context, fld: Field) -> Column:
    return with_edges(ctx, hhmmss(ctx.rng.integers(0, 86400, ctx.n)), TIME_EDGES)


def loose_moments(ctx: Context, seconds: np.ndarray, *, free_text: bool) -> list[str]:
    """A moment in a string whose format the spec does not state: a date, a date-time without
    an offset (`T` or a space), one with an offset, or (`free_text`) anything at all."""
    forms = ctx.rng.choice(5 if free_text else 4, ctx.n)
    plain = np.datetime_as_string(seconds.astype("datetime64[s]"), unit="s").tolist()
    offset = instant_texts(ctx.rng, seconds)
    loose = pick(ctx.rng, LOOSE_TEXTS, ctx.n)
    choices = (
        lambda i: plain[i][:10],
        lambda i: plain[i],
        lambda i: plain[i].replace("T", " "),
        lambda i: offset[i],
        lambda i: loose[i],
    )
    return [choices[form](i) for i, form in enumerate(forms.tolist())]


def moments_in_text(ctx: Context, fld: Field) -> Column:
    """`dob`, `delivered_on`, `..._date`: a moment in free-form text."""
    return loose_moments(ctx, ctx.times(ctx.now - 80 * 365 * 86400), free_text=True)


def times_in_text(ctx: Context, fld: Field) -> Column:
    return pick(ctx.rng, LOOSE_TIMES if not fld.required else LOOSE_TIMES[:-1], ctx.n)


def with_edges(ctx: Context, values: list, edges: Sequence) -> list:
    """A few values replaced by the edges of their type (always drawn: the stream stays put)."""
    chosen = pick(ctx.rng, edges, ctx.n)
    for i in np.flatnonzero(ctx.rng.random(ctx.n) < EDGE_SHARE).tolist():
        values[i] = chosen[i]
    return values


# -- the cursors: their real instants, in every form ------------------------------------------


def instants_as(fld: Field, rng: np.random.Generator, seconds: np.ndarray) -> list[str]:
    """A cursor's moments as a change writes them: a date-time in any of its forms; the
    default profile's text otherwise."""
    if fld.type is Edm.DATETIME:
        return instant_texts(rng, seconds)
    return columns.instants_as(fld, rng, seconds)


def _moments(ctx: Context, fld: Field, seconds: np.ndarray) -> list[str]:
    if fld.type is Edm.DATETIME:
        return instant_texts(ctx.rng, seconds)
    if fld.type is Edm.DATE:
        return iso_dates(seconds)
    return loose_moments(ctx, seconds, free_text=False)  # a cursor always names a moment


def created_at(ctx: Context, fld: Field) -> Column:
    return _moments(ctx, fld, ctx.created)


def updated_at(ctx: Context, fld: Field) -> Column:
    return _moments(ctx, fld, update_instants(ctx))


def appointment_updated_at(ctx: Context, fld: Field) -> Column:
    """One bulk edit: hundreds of rows share an instant, each written in its own form."""
    return bulk_edit(
        ctx, updated_at(ctx, fld), lambda moment, k: instant_texts(ctx.rng, np.full(k, moment))
    )
