"""Conversation state of one `cache_key` beside its KV caches: the append-stable views and the drafter's log-probs.

The caches of a conversation live in the engine's `CacheStore` (asymagent/kv/cache.py, a bounded
LRU of `CacheSession`s); what the chat layer keeps about the same conversation lives here, keyed
by that `CacheSession` object and held weakly: when the LRU drops the session (or a face drops
it after an error), its conversation state goes with it, exactly as if it were one object. kv/
keeps caches only.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field


@dataclass
class Conversation:
    """What the chat layer remembers about one conversation between calls."""

    views: object = None  # its asymagent.context.views.ContextViews (built on first use)
    logprobs: list = field(default_factory=list)  # drafter log p(token_t | tokens_<t) for logprob_ids
    logprob_ids: list = field(default_factory=list)  # the token ids `logprobs` refers to


class ConversationStore:
    """Conversation per CacheSession (weakly keyed: it lives exactly as long as the session)."""

    def __init__(self) -> None:
        self._by_session: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def of(self, session) -> Conversation:
        """The Conversation of `session` (a fresh one on first use)."""
        conv = self._by_session.get(session)
        if conv is None:
            conv = self._by_session[session] = Conversation()
        return conv
