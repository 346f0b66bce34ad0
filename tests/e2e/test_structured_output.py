"""Structured output with the official SDK on the tiny deployment (random weights: only the grammar
makes its answer JSON): `json_schema` answers follow the schema, through prefill -> decode too;
`json_object` answers open a JSON object; a schema that does not compile is a 400 with the reason.
Function calling, built on the same grammar: tests/e2e/test_tools.py."""

from __future__ import annotations

import json

import openai
import pytest

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}


def _ask(client, model, response_format, content="Is the sea blue?", max_tokens=64) -> str:
    extra = {"response_format": response_format} if response_format else {}
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], max_tokens=max_tokens, temperature=0, **extra
    )  # fmt: skip
    return r.choices[0].message.content


def test_a_json_schema_answer_follows_the_schema(openai_client, model_name):
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True}}
    for content in ("Is the sea blue?", "word " * 600):  # the second goes prefill -> decode (512+ tokens)
        answer = json.loads(_ask(openai_client, model_name, fmt, content))
        assert set(answer) == {"answer", "sure"} and answer["answer"] in ("yes", "no")
        assert isinstance(answer["sure"], bool)


def test_a_streamed_json_schema_answer_is_the_same(openai_client, model_name):
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}
    stream = openai_client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "Is the sea blue?"}], max_tokens=64,
        temperature=0, response_format=fmt, stream=True,
    )  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert json.loads(text) == json.loads(_ask(openai_client, model_name, fmt))


def test_a_json_object_answer_opens_an_object(openai_client, model_name):
    """Random weights never close a free-form object within max_tokens (an endless key): what the
    grammar shows here is the object's opening, where the unconstrained answer is any text."""
    text = _ask(openai_client, model_name, {"type": "json_object"}, max_tokens=8)
    assert text.startswith('{"'), text
    assert not _ask(openai_client, model_name, None, max_tokens=8).startswith('{"')


@pytest.mark.parametrize(
    ("response_format", "says"),
    [
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}, "objectx"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nope"}}}, "nope"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "json_schema.schema"),
        ({"type": "yaml"}, "response_format"),
    ],
)
def test_a_bad_response_format_is_a_client_error_with_the_reason(
    openai_client, model_name, response_format, says
):
    with pytest.raises(openai.APIStatusError) as e:
        _ask(openai_client, model_name, response_format)
    assert e.value.status_code in (400, 422) and says in e.value.message
    assert ".cc" not in e.value.message  # no source positions of the backend
