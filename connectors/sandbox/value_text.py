"""Values as the text the service writes them, a column at a time (numpy): dates, instants
with their offsets and fractions, times of day, decimals of varied scale; and a pick from a
pool. The default profile's forms (columns.py); the `wide` profile adds its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def iso_dates(seconds: np.ndarray) -> list[str]:
    return np.datetime_as_string(seconds.astype("datetime64[s]"), unit="D").tolist()


def iso_instants(rng: np.random.Generator, seconds: np.ndarray) -> list[str]:
    """ISO 8601 with a mix of Z and offsets, and sometimes milli- or microseconds."""
    n = len(seconds)
    offsets = rng.choice(np.array(OFFSETS), n)
    local = (seconds + offsets).astype("datetime64[s]")
    text = np.datetime_as_string(local, unit="s").tolist()
    fraction_kind = rng.choice(3, n, p=[0.7, 0.2, 0.1])
    digits = rng.integers(0, 1_000_000, n)
    out = []
    for body, off, kind, frac in zip(text, offsets.tolist(), fraction_kind, digits, strict=True):
        if kind == 1:
            body += f".{frac // 1000:03d}"
        elif kind == 2:
            body += f".{frac:06d}"
        out.append(body + OFFSET_TEXT[off])
    return out


def _offset(seconds: int) -> str:
    if seconds == 0:
        return "Z"
    sign = "+" if seconds > 0 else "-"
    hours, minutes = divmod(abs(seconds) // 60, 60)
    return f"{sign}{hours:02d}:{minutes:02d}"


OFFSETS = [0, 0, 0, 7200, -18000, 19800, -25200, 3600]  # UTC most often, then a few zones
OFFSET_TEXT = {seconds: _offset(seconds) for seconds in OFFSETS}


def utc_instants(seconds: np.ndarray) -> list[str]:
    """Fixed-width UTC with Z (Prescriptions.created_at is a plain string of this form)."""
    return [s + "Z" for s in np.datetime_as_string(seconds.astype("datetime64[s]"), unit="s")]


def hhmmss(seconds_of_day: np.ndarray) -> list[str]:
    h, rest = np.divmod(seconds_of_day, 3600)
    m, s = np.divmod(rest, 60)
    return [f"{a:02d}:{b:02d}:{c:02d}" for a, b, c in zip(h, m, s, strict=True)]


def decimals(rng: np.random.Generator, n: int, high: float) -> list[str]:
    """Decimal text of varied scale: "12", "12.5", "12.50", "0.0001"."""
    cents = rng.integers(0, int(high * 10_000), n)
    scales = rng.choice(np.array([0, 1, 2, 2, 2, 3, 4]), n)
    out = []
    for value, scale in zip(cents.tolist(), scales.tolist(), strict=True):
        whole, frac = divmod(value, 10_000)
        out.append(
            str(whole) if scale == 0 else f"{whole}.{frac:04d}"[: len(str(whole)) + 1 + scale]
        )
    return out


def pick(rng: np.random.Generator, pool: Sequence, n: int) -> list:
    return [pool[i] for i in rng.integers(0, len(pool), n)]
