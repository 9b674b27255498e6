"""Which conversation a request belongs to: the key the Ray router keeps on one replica.

OpenAI's `prompt_cache_key` names a conversation; else the request's `user`; else a hash of the
conversation's leading messages (system/developer messages and the first user turn), which an
agent resending its growing history keeps from step to step. Pure functions on the parsed JSON
body: no Ray, no engine.
"""

from __future__ import annotations

import hashlib
import json

# A completions prompt is keyed by its first characters (a few-shot prefix shared by requests
# lands on one replica, whose KV holds it); token-id prompts by their first ids.
PROMPT_HEAD_CHARS = 512
PROMPT_HEAD_IDS = 128


def _digest(kind: str, value) -> str:
    blob = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return f"{kind}:" + hashlib.sha256(blob.encode()).hexdigest()[:24]


def leading_messages(messages: list) -> list:
    """Messages up to and including the first user message (the conversation's opening)."""
    head = []
    for message in messages:
        head.append(message)
        if isinstance(message, dict) and message.get("role") == "user":
            break
    return head


def _responses_head(body: dict) -> list:
    """The Responses API's opening: `instructions` plus input items up to the first user item."""
    items = body.get("input")
    head: list = [{"role": "system", "content": body.get("instructions")}] \
        if body.get("instructions") else []
    if isinstance(items, str):
        return head + [{"role": "user", "content": items}]
    if isinstance(items, list):
        return head + leading_messages(items)
    return head


def conversation_key(path: str, body) -> str | None:
    """The routing key of a request to `path` with JSON `body` (None: no conversation, route
    by load). `prompt_cache_key` wins over `user`, which wins over the leading messages."""
    if not isinstance(body, dict):
        return None
    for field, tag in (("prompt_cache_key", "pck"), ("user", "user")):
        value = body.get(field)
        if isinstance(value, str) and value:
            return f"{tag}:{value}"
    if path.endswith("/chat/completions") and isinstance(body.get("messages"), list):
        head = leading_messages(body["messages"])
        return _digest("chat", head) if head else None
    if path.endswith("/responses"):
        head = _responses_head(body)
        return _digest("resp", head) if head else None
    if path.endswith("/completions"):
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch: keyed by its first prompt
        if isinstance(prompt, str) and prompt:
            return _digest("text", prompt[:PROMPT_HEAD_CHARS])
        if isinstance(prompt, list) and prompt:
            return _digest("ids", prompt[:PROMPT_HEAD_IDS])
    return None
