"""Tool calling for chat models whose template has no tools (SmolLM2's has none): OpenAI's
``tools`` / ``tool_choice`` / ``parallel_tool_calls`` checked, the tools rendered into the system
message in a documented format, earlier calls and ``role: "tool"`` results rendered back into
the conversation, the forced calls constrained by a JSON schema (each tool's ``parameters``
under its ``name``), and the output read back as ``tool_calls`` (docs/openai.md, "Tool calling").

The format: the system message gets :data:`PREAMBLE` and one JSON line per tool
(``{"name", "description", "parameters"}``); a call is the JSON object
``{"name": ..., "arguments": {...}}``, several calls a JSON array of them."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tritonforge.tasks.generation.structured.errors import StructuredInputError
from tritonforge.tasks.generation.structured.grammar import check_schema

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
PREAMBLE = (
    "You can call functions. To call one, answer with only a JSON object "
    '{"name": <function name>, "arguments": <its arguments>}. The functions:'
)
CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class Tools:
    """A request's tools. ``forced``: the call schema the output must follow (``required`` or a
    named function), None for ``auto`` (the output is a call when it parses as one)."""

    specs: tuple[dict[str, Any], ...]
    choice: str  # auto | required | the named function
    parallel: bool

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(str(t["name"]) for t in self.specs)

    def forced_schema(self) -> dict[str, Any] | None:
        if self.choice == "auto":
            return None
        named = [t for t in self.specs if self.choice in ("required", t["name"])]
        calls = [_call_schema(t) for t in named]
        one = calls[0] if len(calls) == 1 else {"anyOf": calls}
        if self.parallel and self.choice == "required":  # at most as many calls as tools
            return {"type": "array", "items": one, "minItems": 1, "maxItems": len(calls)}
        return one

    def system_text(self) -> str:
        lines = [json.dumps(t, separators=(",", ":")) for t in self.specs]
        return "\n".join([PREAMBLE, *lines])


def _call_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": tool["name"]}, "arguments": strict(tool["parameters"])},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def strict(schema: Any) -> Any:
    """``schema`` as OpenAI's strict mode reads it: an object schema with ``properties`` and no
    ``additionalProperties`` allows no others (a small model otherwise invents some)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if isinstance(out.get("properties"), Mapping) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def parse_tools(body: Mapping[str, Any]) -> Tools | None:
    """The request's :class:`Tools`, or None (no tools, or ``tool_choice: "none"``); a bad
    value raises :class:`StructuredInputError` naming the field."""
    raw, choice = body.get("tools"), body.get("tool_choice")
    if raw is None or raw == []:
        if choice not in (None, "none", "auto"):
            raise StructuredInputError("tool_choice", "needs 'tools'")
        return None
    if not isinstance(raw, list):
        raise StructuredInputError("tools", "must be a list of function tools")
    specs = tuple(_tool(t, i) for i, t in enumerate(raw))
    names = [t["name"] for t in specs]
    if len(set(names)) != len(names):
        raise StructuredInputError("tools", "function names must be unique")
    name = _choice(choice, names)
    if name == "none":
        return None
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise StructuredInputError("parallel_tool_calls", "must be a boolean")
    return Tools(specs, name, parallel)


def _tool(tool: Any, i: int) -> dict[str, Any]:
    field = f"tools[{i}]"
    if not isinstance(tool, Mapping) or tool.get("type") != "function":
        raise StructuredInputError(f"{field}.type", "must be 'function'")
    fn = tool.get("function")
    if not isinstance(fn, Mapping):
        raise StructuredInputError(f"{field}.function", "must be an object")
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise StructuredInputError(f"{field}.function.name", "must be 1-64 of a-z, A-Z, 0-9, _, -")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, Mapping):
        raise StructuredInputError(f"{field}.function.parameters", "must be a JSON schema object")
    out = {"name": name, "parameters": check_schema(dict(params), f"{field}.function.parameters")}
    if isinstance(fn.get("description"), str):
        out["description"] = fn["description"]
    return out


def _choice(choice: Any, names: Sequence[str]) -> str:
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise StructuredInputError(
                "tool_choice", f"must be one of {list(CHOICES)} or a function"
            )
        return choice
    fn = choice.get("function") if isinstance(choice, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(choice, Mapping) or choice.get("type") != "function" or name not in names:
        raise StructuredInputError(
            "tool_choice", f"must name one of the tools {list(names)}: {{'type': 'function', ...}}"
        )
    return str(name)


def render_messages(raw: Any, tools: Tools | None) -> Any:
    """``messages`` with tool calls and results as text the template renders: an assistant
    message's ``tool_calls`` as the call JSON, a ``tool`` message's content as is; the tools
    in the system message. Anything else is left for the message parser to check."""
    if not isinstance(raw, list):
        return raw
    out = []
    for m in raw:
        if isinstance(m, Mapping) and m.get("role") == "assistant" and m.get("tool_calls"):
            out.append({"role": "assistant", "content": _calls_text(m["tool_calls"])})
        else:
            out.append(m)
    if tools is None:
        return out
    text = tools.system_text()
    first = out[0] if out else None
    if isinstance(first, Mapping) and first.get("role") in ("system", "developer"):
        content = first.get("content")
        if isinstance(content, str):
            return [{**first, "content": f"{content}\n\n{text}"}, *out[1:]]
    return [{"role": "system", "content": text}, *out]


def _calls_text(calls: Any) -> str:
    try:
        items = [
            {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
            for c in calls
        ]
    except (TypeError, KeyError, ValueError) as e:
        raise StructuredInputError(
            "messages", f"an assistant's tool_calls must be OpenAI's shape ({e})"
        ) from e
    value: Any = items[0] if len(items) == 1 else items
    return json.dumps(value, separators=(",", ":"))


def parse_calls(text: str, names: Sequence[str]) -> list[dict[str, Any]] | None:
    """The ``tool_calls`` in ``text`` (a call object or an array of them naming known tools),
    in OpenAI's shape, or None when ``text`` is not a call."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if (
            not isinstance(item, dict)
            or item.get("name") not in names
            or not isinstance(item.get("arguments"), dict)
        ):
            return None
        calls.append(
            {
                "id": f"call_{secrets.token_hex(12)}",
                "type": "function",
                "function": {"name": item["name"], "arguments": json.dumps(item["arguments"])},
            }
        )
    return calls or None
