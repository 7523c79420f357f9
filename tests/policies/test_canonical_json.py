"""canonical_json's two encoders give identical bytes: the fast one (orjson, taken when its output
holds no exponent-minus or "0.0000") and the fallback the hashes were first computed with
(``json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)``). Policy files and
cache keys store sha256 hashes of these bytes, so one byte of difference would orphan them."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st

from policies.types import canonical_json

# JSON values as the router hashes them: no NaN/infinity (not JSON), no lone surrogates (not
# encodable as UTF-8 by either encoder); integers of any size (past 64 bits orjson refuses them
# and the fallback writes them).
text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
scalars = (st.none() | st.booleans() | st.integers()
           | st.floats(allow_nan=False, allow_infinity=False) | text)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                      | st.dictionaries(text, inner, max_size=5), max_leaves=20)


def stdlib(payload: Any) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@settings(max_examples=200, deadline=None)
@given(values)
@example({"é": 1, "e": 2, "\U0001f600": 3, "\uffff": 4})  # key order beyond ASCII and the BMP
@example([1e-05, 0.0001, 1e16, 1e22, -0.0, 5e-324, 2**64, -(2**63) - 1])  # the guarded floats
def test_canonical_json_is_the_stdlib_encoding(payload: Any) -> None:
    assert canonical_json(payload) == stdlib(payload)


@settings(max_examples=200, deadline=None)
@given(values)
def test_whenever_the_fast_encoder_is_taken_its_bytes_are_the_fallbacks(payload: Any) -> None:
    try:
        fast = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # refused (integers past 64 bits): the fallback answers alone
        return
    if b"e-" not in fast and b"0.0000" not in fast:  # the guard canonical_json applies
        assert fast == stdlib(payload)
