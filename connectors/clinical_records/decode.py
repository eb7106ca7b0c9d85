"""Response bodies to Python objects, exactly as sent.

msgspec decodes a 100-record appointment page (benchmarks/load_throughput.py's pages) in
0.55 ms where `json` takes 0.97, and, unlike orjson, keeps an integer wider than 64 bits
exact, so a hostile number reaches `ops.rejects` as it was sent. What msgspec refuses but
`json` reads (NaN, lone surrogates, numbers beyond a double) goes to `json`, so the set of
bodies we accept and what they decode to are `json`'s.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

_decoder = msgspec.json.Decoder()


def decode_json(content: bytes) -> Any:
    """Decode a JSON body; raises ValueError when it is not JSON at all, or nests deeper
    than a decoder can follow (both decoders raise RecursionError at ~1,000 levels)."""
    try:
        try:
            return _decoder.decode(content)
        except msgspec.DecodeError:
            return json.loads(content)
    except RecursionError:
        raise ValueError("JSON nested too deeply to decode") from None
