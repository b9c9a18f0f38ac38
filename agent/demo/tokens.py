"""Token counts as a byte-level BPE tokenizer makes them, offline: the demo model's usage, and its max_tokens.

A text is split as GPT-style tokenizers pre-split it (a word with its leading space, a run of digits,
punctuation, whitespace), and each piece is ceil(bytes / 4) tokens, at least one: about what a real
tokenizer makes of English, never more tokens than bytes (what the turn's input bound relies on). A chat
request adds what chat templates add: a few tokens a message, a few to prime the reply, and its tools'
JSON (Anthropic's format adds a hidden tool-use system prompt too: `tools_preamble`).
"""

from __future__ import annotations

import json
import re

_PIECE = re.compile(r"'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d{1,3}| ?[^\s\w]+|\s+")
TOKENS_PER_MESSAGE = 4  # <|start|>role ... <|end|>
TOKENS_PER_REPLY = 3  # the assistant's reply is primed with <|start|>assistant<|message|>
TOKENS_PER_TOOL_CALL = 4
ANTHROPIC_TOOLS_PREAMBLE = 346  # tokens of the tool-use system prompt Anthropic documents for tool_choice auto


def pieces(text: str) -> list[str]:
    return _PIECE.findall(text)


def piece_tokens(piece: str) -> int:
    return max(1, -(-len(piece.encode("utf-8", errors="surrogatepass")) // 4))


def count(text: str) -> int:
    """The tokens of `text`."""
    return sum(piece_tokens(piece) for piece in pieces(text))


def message_tokens(message: dict) -> int:
    content = message.get("content")
    if isinstance(content, list):  # content blocks
        content = " ".join(str(block.get("text", "")) if isinstance(block, dict) else str(block) for block in content)
    text = content if isinstance(content, str) else ""
    tokens = TOKENS_PER_MESSAGE + count(str(message.get("role", ""))) + count(text)
    for call in message.get("tool_calls") or []:
        function = (call.get("function") or {}) if isinstance(call, dict) else {}
        tokens += TOKENS_PER_TOOL_CALL + count(str(function.get("name", "")))
        tokens += count(str(function.get("arguments", "")))
    if message.get("tool_call_id"):
        tokens += count(str(message["tool_call_id"]))
    return tokens


def request_tokens(messages: list[dict], tools: list[dict] | None = None, *, tools_preamble: int = 0) -> int:
    """The input tokens of a chat request."""
    tokens = TOKENS_PER_REPLY + sum(message_tokens(m) for m in messages if isinstance(m, dict))
    if tools:
        tokens += count(json.dumps(tools, separators=(",", ":"))) + tools_preamble
    return tokens


def reply_tokens(message: dict) -> int:
    """The output tokens of an assistant message: its text and its tool calls."""
    tokens = count(message.get("content") or "")
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        tokens += TOKENS_PER_TOOL_CALL + count(function.get("name", "")) + count(function.get("arguments", ""))
    return tokens


def cut_reply(message: dict, max_tokens: int) -> tuple[dict, bool]:
    """The reply as a model stopped at `max_tokens` would leave it (its text cut at a token, the tool calls
    that no longer fit dropped); True when it was cut."""
    if reply_tokens(message) <= max_tokens:
        return message, False
    kept, used = [], 0
    for piece in pieces(message.get("content") or ""):
        if used + piece_tokens(piece) > max_tokens:
            break
        kept.append(piece)
        used += piece_tokens(piece)
    cut = {"role": "assistant", "content": "".join(kept)}
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        cost = TOKENS_PER_TOOL_CALL + count(function.get("name", "")) + count(function.get("arguments", ""))
        if used + cost > max_tokens or len(kept) < len(pieces(message.get("content") or "")):
            break
        calls.append(call)
        used += cost
    if calls:
        cut["tool_calls"] = calls
    return cut, True
