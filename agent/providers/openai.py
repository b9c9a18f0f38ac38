"""Chat Completions with tools, for any OpenAI-compatible server (OpenAI, Ollama, vLLM, llama.cpp, the demo)."""

from __future__ import annotations

import json
import threading
from typing import Any

from agent.deadline import CallTimeout
from agent.providers.base import Completion, ProviderError, RemoteModel, ToolCall
from agent.providers.http import check_status, post_json, redact_json
from agent.providers.spec import ProviderSpec
from agent.surrogates import scrub_json


class OpenAIProvider(RemoteModel):

    def complete(
        self, messages: list[dict], tools: list[dict], timeout: CallTimeout, stop: threading.Event | None = None
    ) -> Completion:
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            body["tools"] = tools
        headers = {"content-type": "application/json", "accept": "application/json"}
        if self._api_key:
            headers["authorization"] = f"Bearer {self._api_key}"
        reply = post_json(f"{self.base_url}/chat/completions", headers=headers, body=body, timeout=timeout, stop=stop,
                          secret=self._api_key)
        check_status(reply, secret=self._api_key)
        return parse_completion(decode_json(reply.body, secret=self._api_key))


OPENAI = ProviderSpec(name="openai", client=OpenAIProvider, default_model="gpt-4o-mini", url_variable="OPENAI_BASE_URL",
                      default_url="https://api.openai.com/v1", key_variable="OPENAI_API_KEY")


def decode_json(body: bytes, *, secret: str | None = None) -> Any:
    """The parsed body, lone surrogates replaced (see agent.surrogates) and the key `secret` redacted
    wherever it appears, or ProviderError("malformed")."""
    try:
        return redact_json(scrub_json(json.loads(body)), secret)
    except (ValueError, RecursionError) as exc:  # RecursionError: "[[[[..." nested deep enough
        raise malformed("the body is not JSON") from exc


def malformed(what: str) -> ProviderError:
    return ProviderError("malformed", f"the provider sent a malformed response: {what}")


def parse_completion(data: Any) -> Completion:
    """Validate a Chat Completions response strictly; anything unexpected is "malformed", never a crash."""
    if not isinstance(data, dict):
        raise malformed("the body is not a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise malformed("'choices' is missing or empty")
    choice = choices[0]
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        raise malformed("'choices[0].message' is missing or not an object")
    message = choice["message"]
    if message.get("role") != "assistant":
        raise malformed("the message role is not 'assistant'")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise malformed("'content' is neither text nor null")
    raw_calls = message.get("tool_calls")
    if raw_calls is None:
        raw_calls = []
    if not isinstance(raw_calls, list):
        raise malformed("'tool_calls' is not a list")
    calls = [_tool_call(raw, index) for index, raw in enumerate(raw_calls)]
    if content is None and not calls:
        content = ""
    return Completion(content=content, tool_calls=calls)


def _tool_call(raw: Any, index: int) -> ToolCall:
    where = f"tool_calls[{index}]"
    if not isinstance(raw, dict):
        raise malformed(f"{where} is not an object")
    if not isinstance(raw.get("id"), str):
        raise malformed(f"{where}.id is not text")
    if raw.get("type") != "function":
        raise malformed(f"{where}.type is not 'function'")
    function = raw.get("function")
    if not isinstance(function, dict):
        raise malformed(f"{where}.function is not an object")
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise malformed(f"{where}.function.name is not text")
    if not isinstance(function.get("arguments"), str):
        # Invalid JSON inside the string is the tool layer's business; a non-string is ours.
        raise malformed(f"{where}.function.arguments is not a string")
    return ToolCall(id=raw["id"], name=function["name"], arguments=function["arguments"])
