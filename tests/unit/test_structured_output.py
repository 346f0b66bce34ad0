"""A JSON schema xgrammar cannot compile is the client's 400 with xgrammar's reason, and nothing of
where in xgrammar's C++ it failed (times, source paths), however deep the error it wraps."""

from __future__ import annotations

import re

import pytest

from services.common.errors import OmniError
from services.pipeline.structured_output import check_json_schema

DEEP = '{"type": "array", "items": ' * 20_000 + "{}" + "}" * 20_000


@pytest.mark.parametrize(
    ("schema", "reason"),
    [('{"type": "nope"}', 'Unsupported type "nope"'), (DEEP, "Maximum recursion depth exceeded")],
    ids=["unsupported type", "too deep"],
)
def test_a_schema_that_does_not_compile_says_why_and_not_where(schema, reason):
    with pytest.raises(OmniError) as e:
        check_json_schema(schema)
    assert e.value.status == 400 and reason in e.value.message, e.value.message
    assert not re.search(r"\.(cc|h|cpp|hpp):\d|/project/|\[\d\d:\d\d:\d\d\]", e.value.message), (
        e.value.message
    )
