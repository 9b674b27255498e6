"""KV cache bookkeeping: one model's DynamicCache over a token view, prefix reuse, crop, sessions.

Invariant kept by everything here: `ModelCache.tokens` is exactly the token ids whose keys and
values are in the cache, and it is always a prefix of the view the cache serves. The tokens of
the view past that prefix are *pending*: the next forward feeds them (plus any draft tokens) and
reads the logits of the last position. A cache therefore never holds the view's last token
between rounds, and prefix reuse keeps at most `len(view) - 1` tokens so the next forward always
re-feeds at least the last prompt token (whose logits start decoding).

transformers 5.24: `DynamicCache.crop(n)` wants a NEGATIVE n (tokens to remove; a positive n
raises), and the model forward takes `cache=` (the `past_key_values=` keyword is deprecated).

A ModelCache made with `static=StaticKVOptions(...)` keeps its K/V in a fixed-capacity StaticKV
(asymagent/kv/static_cache.py: static shapes, CUDA graphs on CUDA) instead of a DynamicCache;
tokens, crop and prefix reuse work the same. Sliding-window layers keep their window plus a
rollback tail (asymagent/kv/sliding_layer.py); a crop further back than that drops the cache and
the next forward re-prefills (`crop`). A model with a LeanForward attached
(asymagent/kv/lean_forward.py: the same logits bit for bit, less Python per forward) is run
through it on a dynamic cache.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from asymagent.kv import feature_capture
from asymagent.kv.feature_capture import CAPTURE_ATTR
from asymagent.kv.growing_cache import crop_floor, croppable_to
from asymagent.kv.lean_forward import lean_of

PREFILL_CHUNK = 1024  # prefill longer than this is fed in chunks, with a progress bar
# New caches append K/V in place into a preallocated buffer (asymagent/kv/growing_cache.py, same
# values, no torch.cat of the whole cache per token); False = transformers' stock DynamicCache.
GROWING_KV = True


class View:
    """A token sequence = a fixed prompt followed by the (shared, growing) generated tokens."""

    __slots__ = ("prompt", "generated")

    def __init__(self, prompt: list, generated: list) -> None:
        self.prompt = prompt  # list[int]
        self.generated = generated  # list[int], shared by all views of one request

    def __len__(self) -> int:
        return len(self.prompt) + len(self.generated)

    def tail(self, start: int) -> list:
        """view[start:] without materialising the whole view."""
        p = len(self.prompt)
        if start >= p:
            return self.generated[start - p:]
        return self.prompt[start:] + self.generated

    def ids(self) -> list:
        return self.prompt + self.generated


def common_prefix_len(a: list, b: list) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The transformer body of a *ForCausalLM (hidden states, no head)."""
    body = getattr(model, "base_model", None)
    if body is None or body is model:
        raise ValueError(f"{type(model).__name__} has no separate decoder body (base_model)")
    return body


@dataclass
class ModelCache:
    """One model's DynamicCache plus the token ids it holds (see the module invariant)."""

    model: torch.nn.Module
    cache: object = None  # DynamicCache (a GrowingCache if GROWING_KV) or StaticKV, made on first use
    tokens: list = field(default_factory=list)  # ids whose K/V are cached
    static: object = None  # StaticKVOptions: keep K/V in a StaticKV (the CUDA-graph decode path)
    # a FeatureCapture (asymagent/kv/feature_capture.py): every dynamic-cache forward hands it the
    # outputs of its layers (EAGLE-3 features for a feature drafter); None: nothing captured
    capture: object = None

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def reset(self) -> None:
        self.cache, self.tokens = None, []
        if self.capture is not None:
            self.capture.reset()  # its features and the feature head's rows go with the cache

    def _new_cache(self):
        if self.static is not None:
            from asymagent.kv.static_cache import StaticKV

            return StaticKV(self.model, self.static)
        if GROWING_KV:
            from asymagent.kv.growing_cache import for_model

            # in bf16 on the CPU under our GQA sdpa, attention reads a multiple of 64 positions: a row's
            # logits then do not depend on how many tokens the forward feeds (growing_cache.py)
            return for_model(self.model)
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def crop(self, keep: int) -> None:
        """Keep the first `keep` cached tokens (DynamicCache.crop takes minus tokens to remove)."""
        remove = len(self.tokens) - keep
        if remove <= 0:
            return
        if keep == 0 and self.static is None:  # a StaticKV keeps its buffers (and graphs)
            self.reset()
            return
        if self.static is None and not croppable_to(self.cache, keep):
            # a sliding-window layer no longer holds the window before `keep` (a rollback longer
            # than its tail, asymagent/kv/sliding_layer.py): drop the cache, the next forward
            # re-prefills the view from its start (exact, never a wrong window)
            self.reset()
            return
        self.cache.crop(-remove)
        del self.tokens[keep:]
        if self.capture is not None:
            self.capture.crop(keep)  # the same positions (kv/feature_capture.py)

    def reserve(self, total: int) -> None:
        """Room for `total` cached positions up front: a StaticKV reallocates (and recaptures its
        graphs) at most once per request; a dynamic cache needs nothing."""
        if self.static is None:
            return
        if self.cache is None:
            self.cache = self._new_cache()
        self.cache.reserve(total)

    def reuse_prefix(self, view_ids: list) -> int:
        """Crop to the longest common prefix with `view_ids[:-1]`; returns the tokens kept."""
        keep = common_prefix_len(self.tokens, view_ids[: max(len(view_ids) - 1, 0)])
        self.crop(keep)
        return len(self.tokens)  # 0 where the crop had to drop a sliding-window cache

    def pending(self, view: View) -> list:
        """Tokens of `view` not yet in the cache (the next forward feeds them first)."""
        return view.tail(len(self.tokens))

    def _inputs(self, ids: list) -> torch.Tensor:
        return torch.tensor([ids], dtype=torch.long, device=self.device)  # [1, T]

    def _ready(self) -> None:
        """Make the cache on first use; hand it the FeatureCapture (if any) for this forward."""
        if self.cache is None:
            self.cache = self._new_cache()
        if self.capture is not None and self.static is None:
            setattr(self.cache, CAPTURE_ATTR, self.capture)
            if feature_capture.TRIM:  # features no crop can bring back may go (a sliding window)
                self.capture.release(crop_floor(self.cache))

    def _record(self, hidden_states) -> None:
        """transformers' forward (capture on): its per-layer outputs to the FeatureCapture
        (hidden_states[i + 1] is layer i's output; the last is after the final norm and is
        never a captured layer, feature_capture.default_layers)."""
        cap = self.capture
        cap.record(len(self.tokens), [hidden_states[i + 1][0] for i in cap.layers])

    @torch.inference_mode()
    def forward_logits(self, ids: list, keep: int) -> torch.Tensor:
        """Feed `ids`; return the logits of the last `keep` positions, [keep, V] (float32)."""
        self._ready()
        lean = None if self.static is not None else lean_of(self.model)
        if self.static is not None:
            logits = self.cache.run(ids, head=True)[-keep:]  # [keep, V] float32
        elif lean is not None:  # the same bits without transformers' per-call Python
            logits = lean.logits(self._inputs(ids), self.cache, keep)[0, -keep:].float()  # [keep, V]
        else:
            capture = self.capture is not None
            extra = {"output_hidden_states": True} if capture else {}  # as before without one
            out = self.model(input_ids=self._inputs(ids), cache=self.cache, use_cache=True,
                             logits_to_keep=keep, **extra)
            if capture:
                self._record(out.hidden_states)
            logits = out.logits[0, -keep:].float()  # [keep, V]
        self.tokens.extend(ids)
        return logits

    @torch.inference_mode()
    def forward_hidden(self, ids: list) -> torch.Tensor:
        """Feed `ids` through the decoder body only; final hidden states [T, H] (no head)."""
        self._ready()
        lean = None if self.static is not None else lean_of(self.model)
        if self.static is not None:
            hidden = self.cache.run(ids, head=False)  # [T, H]
        elif lean is not None:
            hidden = lean.hidden(self._inputs(ids), self.cache)[0]  # [T, H]
        else:
            capture = self.capture is not None
            extra = {"output_hidden_states": True} if capture else {}
            out = decoder_of(self.model)(input_ids=self._inputs(ids), cache=self.cache,
                                         use_cache=True, **extra)
            if capture:
                self._record(out.hidden_states)
            hidden = out.last_hidden_state[0]  # [T, H]
        self.tokens.extend(ids)
        return hidden

    @torch.inference_mode()
    def prefill(self, ids: list, desc: str = "prefill") -> None:
        """Feed `ids` (no logits needed: only the body runs), chunked with a progress bar if long."""
        if not ids:
            return
        if len(ids) <= PREFILL_CHUNK:
            self.forward_hidden(ids)
            return
        from tqdm.auto import tqdm

        with tqdm(total=len(ids), desc=desc, unit="tok", leave=False) as bar:
            for start in range(0, len(ids), PREFILL_CHUNK):
                chunk = ids[start:start + PREFILL_CHUNK]
                self.forward_hidden(chunk)
                bar.update(len(chunk))


@dataclass
class ViewCache:
    """A ModelCache serving one View: forwards feed the view's pending tokens first.

    After a round the cache is cropped back to the committed tokens it holds (`commit`), so the
    module invariant holds again once the emitted tokens join the view.
    """

    cache: ModelCache
    view: View

    def pending(self) -> list:
        return self.cache.pending(self.view)

    def logits(self, extra: list, keep: int) -> torch.Tensor:
        """Feed the pending tokens + `extra`; logits of the last `keep` positions [keep, V]."""
        return self.cache.forward_logits(self.pending() + extra, keep)

    def hidden(self, extra: list, keep: int) -> torch.Tensor:
        """Feed the pending tokens + `extra`; hidden states of the last `keep` positions [keep, H]."""
        return self.cache.forward_hidden(self.pending() + extra)[-keep:]

    def catch_up(self, desc: str = "prefill (deferred)") -> int:
        """Feed the pending tokens but the last (chunked, with a progress bar if long; the next
        forward feeds the last and reads its output): a request's prefill, or a deferred one
        before the cache's first forward. Returns how many were pending, the last included."""
        pending = self.pending()
        self.cache.prefill(pending[:-1], desc=desc)
        return len(pending)

    def pending_prompt(self) -> int:
        """Tokens of the view's prompt not yet in the cache."""
        return max(len(self.view.prompt) - len(self.cache), 0)

    def commit(self, accepted: int) -> None:
        """Keep the view (as it was before the round's tokens) plus `accepted` fed tokens."""
        self.cache.crop(len(self.view) + accepted)


class CacheSession:
    """The caches of one conversation (`cache_key`): one ModelCache per (model, view) role.

    Roles: "verifier_full", "verifier_compressed", "drafter_full", "drafter_compressed" (base).
    `static` maps a role to its StaticKVOptions (roles not in it use a dynamic cache).
    """

    def __init__(self, models: dict, static: dict | None = None) -> None:
        self._models = models  # role -> model
        self._static = static or {}
        self.caches: dict = {}  # the chat state beside them: asymagent/chat/conversation.py

    def get(self, role: str) -> ModelCache:
        if role not in self.caches:
            self.caches[role] = ModelCache(self._models[role], static=self._static.get(role))
        return self.caches[role]


class CacheStore:
    """A bounded LRU of CacheSessions keyed by `cache_key` (oldest session dropped first)."""

    def __init__(self, models: dict, max_sessions: int = 4, static: dict | None = None) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be >= 1")
        self._models = models
        self._static = static  # role -> StaticKVOptions (CacheSession)
        self.max_sessions = max_sessions
        self._sessions: OrderedDict = OrderedDict()

    def session(self, key: str) -> CacheSession:
        if key in self._sessions:
            self._sessions.move_to_end(key)
            return self._sessions[key]
        session = CacheSession(self._models, self._static)
        self._sessions[key] = session
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        return session

    def drop(self, key: str) -> None:
        self._sessions.pop(key, None)

    def clear(self) -> None:
        self._sessions.clear()

    def __len__(self) -> int:
        return len(self._sessions)
