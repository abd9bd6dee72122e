"""Tool calling (`tools`, `tool_choice`): the prompt that offers the tools, the output constraint
that makes a forced call parseable, and the parser that turns the output into `tool_calls`.

Pure (no engine, no network). The output format follows what vLLM does for every model:

- `tool_choice` names a function: the output is constrained to that function's `parameters`
  schema and is the call's `arguments`;
- `"required"`: the output is constrained to a JSON array of `{"name", "arguments"}` objects, one
  per call (at most one without `parallel_tool_calls`), each `arguments` matching its function;
- `"auto"`: the output is free; calls are `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
  spans (the Hermes format), and the text around them is the message content;
- `"none"`: the output is plain content, never parsed.

A model whose chat template renders `tools` itself gets them through the template; otherwise
(the built-in tiny model) the router describes them in a system message.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from splitserve.engine.messages import StructuredOutput

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
_CALL_SPAN = re.compile(
    re.escape(TOOL_CALL_START) + r"\s*(.*?)\s*" + re.escape(TOOL_CALL_END), re.DOTALL
)
# A function without `parameters` takes none: its arguments are the empty object.
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}

Mode = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True)
class ToolSpec:
    """The request's functions and how its output calls them (built by `prepare`).

    `functions`: `{"name", "description"?, "parameters"?}` objects as the client sent them;
    `named`: the function `tool_choice` forces (mode "named").
    """

    functions: tuple[dict[str, Any], ...]
    mode: Mode = "auto"
    named: str | None = None
    parallel: bool = True

    @property
    def parses(self) -> bool:
        """Whether the output is parsed for calls (every mode but "none")."""
        return self.mode != "none"

    def parameters(self, name: str) -> dict[str, Any]:
        """The JSON schema of a function's arguments."""
        for f in self.functions:
            if f["name"] == name:
                return f.get("parameters") or NO_PARAMETERS
        raise KeyError(name)

    def constraint(self) -> StructuredOutput | None:
        """The output constraint of a forced call ("named", "required"); None for a free one."""
        if self.mode == "named" and self.named is not None:
            return StructuredOutput(json=json.dumps(self.parameters(self.named)))
        if self.mode == "required":
            items = [
                {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "enum": [f["name"]]},
                        "arguments": self.parameters(f["name"]),
                    },
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                }
                for f in self.functions
            ]
            schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
            if not self.parallel:
                schema["maxItems"] = 1
            return StructuredOutput(json=json.dumps(schema))
        return None

    def system_prompt(self) -> str:
        """The system message that offers the tools (for templates that do not render them)."""
        lines = "\n".join(
            json.dumps({"type": "function", "function": f}, sort_keys=True)
            for f in self.functions
        )
        return (
            "You may call one or more functions. Their signatures, as JSON schemas:\n"
            f"<tools>\n{lines}\n</tools>\n"
            f'To call a function, answer with {TOOL_CALL_START}{{"name": <function name>, '
            f'"arguments": <arguments object>}}{TOOL_CALL_END}, one span per call.'
        )

    def parse(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """(message content, tool_calls) of one choice's output text.

        Output that does not parse as the mode's format stays content (e.g. cut by `max_tokens`):
        the client gets what was generated, never an error after the fact.
        """
        if self.mode == "named" and self.named is not None:
            args = _json(text)
            if isinstance(args, dict):
                return None, [_call(self.named, args)]
            return text, []
        if self.mode == "required":
            calls = _json(text)
            if isinstance(calls, list) and calls and all(self._valid(c) for c in calls):
                return None, [_call(c["name"], c["arguments"]) for c in calls]
            return text, []
        if self.mode == "auto":
            return self._parse_spans(text)
        return text, []

    def finish_reason(self, engine_reason: str | None, calls: list[dict[str, Any]]) -> str | None:
        """OpenAI's finish reason: "tool_calls" when the model chose to call ("auto",
        "required"); a forced named call finishes with "stop", as OpenAI's does."""
        if calls and engine_reason == "stop" and self.mode in ("auto", "required"):
            return "tool_calls"
        return engine_reason

    def _valid(self, call: Any) -> bool:
        names = {f["name"] for f in self.functions}
        return (
            isinstance(call, dict)
            and call.get("name") in names
            and isinstance(call.get("arguments"), dict)
        )

    def _parse_spans(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        calls, kept, last = [], [], 0
        for m in _CALL_SPAN.finditer(text):
            call = _json(m.group(1))
            if not self._valid(call):
                continue
            calls.append(_call(call["name"], call["arguments"]))
            kept.append(text[last : m.start()])
            last = m.end()
        if not calls:
            return text, []
        content = ("".join(kept) + text[last:]).strip()
        return content or None, calls


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def render_messages(
    messages: list[dict[str, Any]], tools: ToolSpec | None
) -> list[dict[str, str]]:
    """Chat messages as `{"role", "content"}` for a template that knows nothing of tools: the
    tools offered in a leading system message, an assistant's earlier `tool_calls` written as
    the `<tool_call>` spans it would have generated, tool results as plain `tool` messages."""
    out = [{"role": "system", "content": tools.system_prompt()}] if tools is not None else []
    for m in messages:
        content = m.get("content") or ""
        calls = m.get("tool_calls") or []
        if calls:
            spans = "".join(
                TOOL_CALL_START
                + json.dumps({"name": c["function"]["name"],
                              "arguments": _json(c["function"]["arguments"]) or {}})
                + TOOL_CALL_END
                for c in calls
            )
            content = content + spans
        out.append({"role": m["role"], "content": content})
    return out
