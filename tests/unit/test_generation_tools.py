"""Tool calling's pure parts (tasks/generation/tools.py): the checks name the field, the call
schema is strict, messages carry earlier calls and the tools, outputs read back as calls."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tritonforge.tasks.generation.structured import StructuredInputError
from tritonforge.tasks.generation.tools import parse_calls, parse_tools, render_messages

F = {
    "type": "function",
    "function": {
        "name": "f",
        "description": "d",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    },
}
G = {"type": "function", "function": {"name": "g"}}


def test_forced_schemas_by_tool_choice() -> None:
    assert parse_tools({"tools": [F], "tool_choice": "none"}) is None
    assert parse_tools({"tools": [F]}).forced_schema() is None  # type: ignore[union-attr]
    named = parse_tools(
        {"tools": [F, G], "tool_choice": {"type": "function", "function": {"name": "g"}}}
    )
    assert named is not None and named.forced_schema()["properties"]["name"] == {"const": "g"}  # type: ignore[index]
    required = parse_tools({"tools": [F, G], "tool_choice": "required"})
    schema: Any = required.forced_schema()  # type: ignore[union-attr]
    assert (
        schema["type"] == "array" and schema["maxItems"] == 2 and len(schema["items"]["anyOf"]) == 2
    )
    args = schema["items"]["anyOf"][0]["properties"]["arguments"]
    assert args["additionalProperties"] is False  # strict: no invented properties
    single = parse_tools({"tools": [F], "tool_choice": "required", "parallel_tool_calls": False})
    assert single.forced_schema()["type"] == "object"  # type: ignore[index, union-attr]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tools": "x"}, "tools"),
        ({"tools": [{"type": "code"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]},
            "tools[0].function.parameters",
        ),
        ({"tools": [F, F]}, "tools"),
        ({"tools": [F], "tool_choice": "always"}, "tool_choice"),
        (
            {"tools": [F], "tool_choice": {"type": "function", "function": {"name": "g"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [F], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ],
)
def test_bad_tools_name_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(StructuredInputError) as e:
        parse_tools(body)
    assert e.value.field == field


def test_messages_carry_the_tools_and_earlier_calls() -> None:
    tools = parse_tools({"tools": [F]})
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    out = render_messages(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c", "content": "2"},
        ],
        tools,
    )
    assert out[0]["content"].startswith("Be brief.\n\nYou can call functions")
    assert '"name":"f"' in out[0]["content"]
    assert json.loads(out[2]["content"]) == {"name": "f", "arguments": {"a": 1}}
    assert out[3] == {"role": "tool", "tool_call_id": "c", "content": "2"}
    assert render_messages([{"role": "user", "content": "x"}], tools)[0]["role"] == "system"


def test_outputs_read_back_as_calls() -> None:
    calls = parse_calls(
        '[{"name":"f","arguments":{"a":1}},{"name":"g","arguments":{}}]', ["f", "g"]
    )
    assert calls is not None and [c["function"]["name"] for c in calls] == ["f", "g"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1}
    assert calls[0]["id"].startswith("call_") and calls[0]["id"] != calls[1]["id"]
    assert parse_calls("Paris is sunny.", ["f"]) is None
    assert parse_calls('{"name":"h","arguments":{}}', ["f"]) is None
    assert parse_calls('{"name":"f","arguments":{"a":', ["f"]) is None
