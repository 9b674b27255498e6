"""Stored Responses API answers and the conversation that made them (the ingress's memory).

A replica's `/v1/responses` keeps its answers in its own memory (integrations/server/responses.py),
so `previous_response_id` and `GET /v1/responses/{id}` work only on the replica that answered.
The ingress learns each answer's id from the response it forwards (the JSON body's `id`, or in a
stream the `response.created` event) and remembers id -> conversation key, so a request naming
that id is routed with the conversation's key, to the same replica. Ids it never saw (forgotten,
or answered before a restart) route as usual, and the replica answers its 404.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict

MAX_IDS = 100_000
_CREATED = re.compile(rb'"type":\s*"response\.created"')


class ResponseOwners:
    """Thread-safe LRU: response id -> the conversation key it was routed with."""

    def __init__(self, max_ids: int = MAX_IDS) -> None:
        self.max_ids = max_ids
        self._keys: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def key_for(self, method: str, path: str, body) -> str | None:
        """The conversation key a request inherits from a response it names, else None."""
        response_id = None
        if method == "POST" and path == "/v1/responses" and isinstance(body, dict):
            response_id = body.get("previous_response_id")
        elif method == "GET" and path.startswith("/v1/responses/"):
            response_id = path[len("/v1/responses/"):]
        if not isinstance(response_id, str):
            return None
        with self._lock:
            return self._keys.get(response_id)

    def learn(self, key: str | None, response_id) -> None:
        if key is None or not isinstance(response_id, str) or not response_id:
            return
        with self._lock:
            self._keys[response_id] = key
            self._keys.move_to_end(response_id)
            while len(self._keys) > self.max_ids:
                self._keys.popitem(last=False)


def response_id_in(chunk: bytes) -> str | None:
    """The response id in a /v1/responses answer chunk: a whole JSON body, or an SSE chunk
    holding the `response.created` event."""
    text = chunk.strip()
    if text.startswith(b"{"):
        try:
            data = json.loads(text)
        except ValueError:
            return None
        return data.get("id") if isinstance(data, dict) else None
    if not _CREATED.search(chunk):
        return None
    for line in chunk.splitlines():
        if line.startswith(b"data: ") and _CREATED.search(line):
            try:
                event = json.loads(line[6:])
            except ValueError:
                return None
            return (event.get("response") or {}).get("id")
    return None
