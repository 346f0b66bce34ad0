"""Client JSON within limits: every violation is a JsonLimitError, never another exception."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common import untrusted_json
from services.common.untrusted_json import JsonLimitError


@pytest.mark.parametrize(
    "raw",
    [
        "[" * 100_000,  # the parser's recursion limit
        "[" * 40 + "]" * 40,  # deeper than MAX_DEPTH, within the recursion limit
        '{"a": ' * 33 + "1" + "}" * 33,
        "1" * 5000,  # Python's int digits limit would raise ValueError
        '{"n": -123456789012345678901}',
        "1e999",
        '{"t": NaN}',
        "[Infinity]",
        '"\\ud800"',  # a lone surrogate
        '{"\\udfff": 1}',
        b'"\xff\xfe"',  # not UTF-8
        b'{"a": "\xc3"}',
        "{",
        "",
    ],
)
def test_violations_are_json_limit_errors(raw):
    with pytest.raises(JsonLimitError):
        untrusted_json.loads(raw)


def test_within_limits_parses_as_json_does():
    raw = json.dumps({"a": [1, -2, 3.5, "é", "😀", None, True], "n": 2**63 - 1, "d": [[[]]]})
    assert untrusted_json.loads(raw) == json.loads(raw)
    assert untrusted_json.loads(raw.encode()) == json.loads(raw)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200))
def test_arbitrary_input_parses_or_is_refused(raw):
    try:
        untrusted_json.loads(raw)
    except JsonLimitError as e:
        assert e.message and e.code in ("invalid_json", "invalid_unicode")


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_valid_json_round_trips(value):
    raw = json.dumps(value)
    try:
        assert untrusted_json.loads(raw) == json.loads(raw)
    except JsonLimitError as e:  # only for text hypothesis made with lone surrogates
        assert e.code == "invalid_unicode"
