"""The Anthropic Messages API with tools; the history stays in OpenAI chat format and is mapped per call."""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from agent.deadline import CallTimeout
from agent.providers.base import Completion, RemoteModel, ToolCall
from agent.providers.http import check_status, post_json
from agent.providers.openai import decode_json, malformed
from agent.providers.spec import ProviderSpec

ANTHROPIC_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 1024  # tokens per response
MISSING_RESULT = "Error: the tool did not run (the turn ended first)"
_UNSAFE_ID = re.compile(r"[^a-zA-Z0-9_-]")
_IGNORED_BLOCKS = ("thinking", "redacted_thinking")  # reasoning the history does not keep


class AnthropicProvider(RemoteModel):
    def __init__(self, base_url: str, model: str, api_key: str | None, max_tokens: int = DEFAULT_MAX_TOKENS):
        super().__init__(base_url, model, api_key)
        self.max_tokens = max_tokens

    def complete(
        self, messages: list[dict], tools: list[dict], timeout: CallTimeout, stop: threading.Event | None = None
    ) -> Completion:
        system, mapped = to_anthropic_messages(messages)
        body: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "messages": mapped}
        if system:
            body["system"] = system
        if tools:
            body["tools"] = to_anthropic_tools(tools)
        headers = {"content-type": "application/json", "anthropic-version": ANTHROPIC_VERSION}
        if self._api_key:
            headers["x-api-key"] = self._api_key
        reply = post_json(f"{self.base_url}/v1/messages", headers=headers, body=body, timeout=timeout, stop=stop,
                          secret=self._api_key)
        check_status(reply, secret=self._api_key)
        return parse_message(decode_json(reply.body, secret=self._api_key))


ANTHROPIC = ProviderSpec(name="anthropic", client=AnthropicProvider, default_model="claude-sonnet-4-5",
                         url_variable="ANTHROPIC_BASE_URL", default_url="https://api.anthropic.com",
                         key_variable="ANTHROPIC_API_KEY")


def to_anthropic_tools(tools: list[dict]) -> list[dict]:
    """OpenAI function schemas -> Anthropic tool definitions."""
    mapped = []
    for tool in tools:
        function = tool.get("function", tool)
        mapped.append(
            {
                "name": function["name"],
                "description": function.get("description") or "",
                "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
            }
        )
    return mapped


def to_anthropic_messages(messages: list[dict]) -> tuple[str, list[dict]]:
    """OpenAI-format history -> (system text, alternating user/assistant messages with content blocks)."""
    system_parts: list[str] = []
    turns: list[dict] = []

    def add(role: str, blocks: list[dict]) -> None:
        if not blocks:
            return  # Anthropic refuses empty content
        if turns and turns[-1]["role"] == role:  # Anthropic requires strict alternation
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": list(blocks)})

    for message in messages:
        role = message.get("role")
        content = _text(message.get("content"))
        if role == "system":
            if content:
                system_parts.append(content)
        elif role == "user":
            add("user", [{"type": "text", "text": content}] if content else [])
        elif role == "assistant":
            blocks = [{"type": "text", "text": content}] if content else []
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": _safe_id(call.get("id", "")),
                        "name": function.get("name", ""),
                        "input": _arguments(function.get("arguments")),
                    }
                )
            add("assistant", blocks)
        elif role == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": _safe_id(message.get("tool_call_id", "")),
                "content": content,
            }
            if content.startswith("Error:"):
                result["is_error"] = True
            add("user", [result])
    return "\n\n".join(system_parts), _pair_tool_results(turns)


def _pair_tool_results(turns: list[dict]) -> list[dict]:
    """Every tool_use gets a tool_result in the next user message, first in it; orphan results become text.

    A turn that ended between a model call and its tool runs leaves tool calls without results,
    which Anthropic refuses; the next turn must still be sendable.
    """
    fixed: list[dict] = []
    expected: list[str] = []
    for turn in turns:
        if turn["role"] == "assistant":
            if expected:  # the previous tool calls never got a user message at all
                fixed.append({"role": "user", "content": [_missing(i) for i in expected]})
            fixed.append(turn)
            expected = [b["id"] for b in turn["content"] if b["type"] == "tool_use"]
            continue
        results, others = [], []
        for block in turn["content"]:
            if block["type"] == "tool_result" and block["tool_use_id"] in expected:
                results.append(block)
            elif block["type"] == "tool_result":
                others.append({"type": "text", "text": f"Tool result: {block['content']}"})
            else:
                others.append(block)
        answered = {b["tool_use_id"] for b in results}
        results += [_missing(i) for i in expected if i not in answered]
        fixed.append({"role": "user", "content": results + others})
        expected = []
    if expected:
        fixed.append({"role": "user", "content": [_missing(i) for i in expected]})
    return fixed


def _missing(tool_use_id: str) -> dict:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": MISSING_RESULT, "is_error": True}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _arguments(arguments: Any) -> dict:
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _safe_id(tool_id: Any) -> str:
    # Anthropic accepts ids matching [a-zA-Z0-9_-]+; other servers' ids may not.
    return _UNSAFE_ID.sub("_", str(tool_id)) or "call"


def parse_message(data: Any) -> Completion:
    """Validate a Messages API response strictly; anything unexpected is "malformed", never a crash."""
    if not isinstance(data, dict) or data.get("type") != "message":
        raise malformed("the body is not a message object")
    if data.get("role", "assistant") != "assistant":
        raise malformed("the message role is not 'assistant'")
    blocks = data.get("content")
    if not isinstance(blocks, list):
        raise malformed("'content' is not a list")
    texts: list[str] = []
    calls: list[ToolCall] = []
    for index, block in enumerate(blocks):
        where = f"content[{index}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise malformed(f"{where}.text is not text")
            texts.append(block["text"])
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) or not block["name"]:
                raise malformed(f"{where} has no tool id or name")
            if not isinstance(block.get("input"), dict):
                raise malformed(f"{where}.input is not an object")
            calls.append(ToolCall(id=block["id"], name=block["name"], arguments=json.dumps(block["input"])))
        elif kind in _IGNORED_BLOCKS:
            continue
        else:
            raise malformed(f"{where} has an unexpected type")
    content: str | None = "".join(texts)
    if not content and calls:
        content = None
    return Completion(content=content, tool_calls=calls)
