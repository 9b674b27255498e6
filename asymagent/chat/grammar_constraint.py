"""GrammarConstraint: an xgrammar matcher as a TokenConstraint (masks, rollback, jump-forward).

The machinery shared by the constraints of the chat layer (`ToolCallConstraint` for schema-valid
tool calls, `ResponseFormatConstraint` for `response_format` JSON): a subclass says which grammar
to build from a hashable key (`build_grammar(*key)`); this base compiles it once per tokenizer
and key, and drives the matcher through the protocol in asymagent/decoding/constraint.py.
When the grammar is complete (`is_completed()`) only the stop tokens (`<|im_end|>`, EOS) may
follow; a single stop token is forced, and `is_terminated()` turns true once it is accepted.

Why xgrammar (vs outlines-core, llguidance, lm-format-enforcer): it installs from PyPI as a CPU
wheel, builds its tokenizer info from a local HF tokenizer without downloads, compiles JSON
schema into a grammar in ~0.15 s, and its matcher has the two operations speculation needs:
unlimited `rollback` (drafts that get rejected) and jump-forward strings. Measured overhead per
token (mask fill + [V] bool unpack + advance, vocab 49152): docs/agent.md and
`asymagent.chat.tool_constraint.measure_overhead`.

Jump-forward: `forced_tokens()` returns only tokens whose encoding is unambiguous: the common
prefix of the model tokenizer's encoding of the forced string and xgrammar's greedy longest-match
tokenisation, minus the last token of the string (the text that follows might merge with it).
While forced tokens exist, `allowed_mask()` admits only the first of them. So forced text has one
tokenisation whether the engine jumps forward or a model decodes it (e.g. a draft spanning the
forced region in a speculative round): greedy speculation under the constraint stays
token-identical to the verifier alone.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from asymagent.chat.ebnf_text import bound_number_digits

_LOOSE_CHARS = r'[^\"\\\r\n]'  # EBNF char class xgrammar uses for bounded strings
_STRICT_CHARS = r'[^\0-\x1f\"\\\r\n]'  # the same without control characters
_XGRAMMAR_LOG_HEAD = re.compile(r"\[[0-9:]+\] \S+:[0-9]+: ")  # "[10:27:10] /project/cpp/x.cc:88: "


def xgrammar_error(exc: Exception) -> str:
    """xgrammar's error text without its log stamp and C++ source path (a client sees it)."""
    return _XGRAMMAR_LOG_HEAD.sub("", str(exc)).strip()


def json_schema_grammar(schema: dict, strict: bool = True):
    """xgrammar Grammar for one JSON value matching `schema`, compact (`", "`, `": "`, no other
    whitespace, as json.dumps writes it). `strict`: no properties or items the schema does not
    name (xgrammar's strict_mode), so the output validates against the schema either way.
    Numbers have bounded digits (asymagent/chat/ebnf_text.py), so every number ends."""
    import xgrammar as xg

    body = xg.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False,
                                       separators=(", ", ": "), strict_mode=strict)
    # xgrammar 0.2.9 writes length-bounded strings as [^"\\\r\n]{0,n}, which admits raw
    # control characters (invalid JSON: json.loads rejects them). Forbid them, as its
    # unbounded string rule already does.
    ebnf = str(body)
    edited = bound_number_digits(ebnf.replace(_LOOSE_CHARS, _STRICT_CHARS))
    return body if edited == ebnf else xg.Grammar.from_ebnf(edited)


def uses_hermes_format(tokenizer) -> bool:
    """True when the tokenizer's chat template renders `tools` (Hermes `<tool_call>` style)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = " ".join(str(v) for v in template.values())
    return "tools" in template and "tool_call" in template


def stop_token_ids(tokenizer) -> tuple:
    """`<|im_end|>` (when the vocabulary has it) and EOS: what may follow a complete grammar."""
    ids = set()
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != getattr(tokenizer, "unk_token_id", None):
        ids.add(im_end)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if not ids:
        raise ValueError("tokenizer has neither <|im_end|> nor an EOS token")
    return tuple(sorted(ids))


@lru_cache(maxsize=8)
def _tokenizer_info(tokenizer, vocab_size: int, stop_ids: tuple):
    import xgrammar as xg

    return xg.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                             stop_token_ids=list(stop_ids))


@lru_cache(maxsize=8)
def _compiler(tokenizer, vocab_size: int, stop_ids: tuple):
    import xgrammar as xg

    return xg.GrammarCompiler(_tokenizer_info(tokenizer, vocab_size, stop_ids))


@lru_cache(maxsize=64)
def _compiled(kind: type, tokenizer, vocab_size: int, stop_ids: tuple, key: tuple):
    return _compiler(tokenizer, vocab_size, stop_ids).compile_grammar(kind.build_grammar(*key))


@dataclass
class _Counters:
    mask_s: float = 0.0  # time in allowed_mask (fill + unpack)
    masks: int = 0
    advance_s: float = 0.0  # time in advance
    advances: int = 0


class GrammarConstraint:
    """TokenConstraint (asymagent/decoding/constraint.py) over a compiled xgrammar grammar.

    Subclasses implement `build_grammar(*key) -> xgrammar.Grammar` (a classmethod) and call
    `super().__init__(tokenizer, key, vocab_size=...)`; `key` must be hashable (it keys the
    compile cache). vocab_size: the model's logits size (may exceed len(tokenizer); extra ids
    are never allowed).
    """

    @classmethod
    def build_grammar(cls, *key):
        raise NotImplementedError

    def __init__(self, tokenizer, key: tuple, *, vocab_size: int | None = None):
        import xgrammar as xg

        self.tokenizer = tokenizer
        self.vocab_size = int(vocab_size or len(tokenizer))
        if self.vocab_size < len(tokenizer):
            raise ValueError(f"vocab_size {self.vocab_size} is smaller than the tokenizer "
                             f"({len(tokenizer)} tokens)")
        self.stop_ids = stop_token_ids(tokenizer)
        compiled = _compiled(type(self), tokenizer, self.vocab_size, self.stop_ids, key)
        self._matcher = xg.GrammarMatcher(compiled)
        self._bitmask = xg.allocate_token_bitmask(1, self.vocab_size)  # [1, ceil(V/32)] int32
        self._history: list[int] = []  # accepted token ids, for rollback bookkeeping
        self._forced: list[int] | None = None  # forced tokens at the current state (cache)
        self.counters = _Counters()

    # --- TokenConstraint protocol -------------------------------------------------------
    def allowed_mask(self) -> torch.Tensor:
        """[V] bool: tokens the grammar admits next (stop tokens once it is complete)."""
        t0 = time.perf_counter()
        forced = self.forced_tokens()
        if forced or self._matcher.is_terminated():
            # Forced text has one canonical tokenisation, whoever decodes it. After the stop
            # token nothing may follow; engines may still read a mask there (a K+1 position).
            mask = torch.zeros(self.vocab_size, dtype=torch.bool)  # [V]
            mask[forced[:1] if forced else list(self.stop_ids)] = True
            self.counters.mask_s += time.perf_counter() - t0
            self.counters.masks += 1
            return mask
        self._matcher.fill_next_token_bitmask(self._bitmask)
        words = self._bitmask[0].numpy().astype("<i4", copy=False)  # [W], bit j of w <-> 32w+j
        # Little-endian words (forced above): byte b of word w holds tokens 32w+8b .. 32w+8b+7, low bit first.
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")  # [32W] uint8
        mask = torch.from_numpy(bits[: self.vocab_size].view(np.bool_))  # [V]
        self.counters.mask_s += time.perf_counter() - t0
        self.counters.masks += 1
        return mask

    def advance(self, token_id: int) -> bool:
        t0 = time.perf_counter()
        token_id = int(token_id)
        self._forced = None
        if self._matcher.is_terminated():
            # Extra stop tokens after the end are absorbed (a speculative round may emit one
            # at its bonus position); recorded as -1 so rollback stays exact.
            ok = token_id in self.stop_ids
            if ok:
                self._history.append(-1)
        else:
            ok = 0 <= token_id < self.vocab_size and self._matcher.accept_token(token_id)
            if ok:
                self._history.append(token_id)
        self.counters.advance_s += time.perf_counter() - t0
        self.counters.advances += 1
        return bool(ok)

    def rollback(self, num_tokens: int) -> None:
        if num_tokens < 0 or num_tokens > len(self._history):
            raise ValueError(f"cannot roll back {num_tokens} tokens; "
                             f"{len(self._history)} were accepted")
        if num_tokens:
            self._forced = None
            real = sum(1 for t in self._history[-num_tokens:] if t >= 0)
            if real:
                self._matcher.rollback(real)
            del self._history[-num_tokens:]

    def forced_tokens(self) -> list[int]:
        if self._forced is None:  # computed once per matcher state (advance/rollback reset it)
            self._forced = self._compute_forced()
        return list(self._forced)

    def _compute_forced(self) -> list[int]:
        if self._matcher.is_terminated():
            return []
        if self._matcher.is_completed():
            # The grammar may end here. When only stop tokens may follow (no further call of a
            # parallel-calls grammar) and there is a single one, it is forced too, so every
            # decoding mode ends with the same token.
            if len(self.stop_ids) != 1 or self._continues():
                return []
            return [self.stop_ids[0]]
        forced = self._matcher.find_jump_forward_string()
        if not forced:
            return []
        ours = self.tokenizer.encode(forced, add_special_tokens=False)
        theirs = self._matcher.find_jump_forward_tokens()
        common: list[int] = []
        for a, b in zip(ours, theirs):
            if a != b:
                break
            common.append(int(a))
        if len(common) == len(ours):  # the string's last token could merge with what follows
            common = common[:-1]
        # Final check: every token must be accepted in sequence (then undo).
        accepted = 0
        for tok in common:
            if not self._matcher.accept_token(tok):
                break
            accepted += 1
        if accepted:
            self._matcher.rollback(accepted)
        return common[:accepted]

    def _continues(self) -> bool:
        """Whether any token other than a stop token is allowed at the current state."""
        self._matcher.fill_next_token_bitmask(self._bitmask)
        words = self._bitmask[0].numpy().astype("<i4", copy=False)  # [W]
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")[: self.vocab_size]  # [V]
        bits[list(self.stop_ids)] = 0
        return bool(bits.any())

    def is_terminated(self) -> bool:
        """Complete and the stop token after it accepted (nothing more may follow)."""
        return bool(self._matcher.is_terminated())

    def is_completed(self) -> bool:
        """The grammar's text is complete (only stop tokens may follow)."""
        return bool(self._matcher.is_completed())

    # --- helpers ------------------------------------------------------------------------
    @property
    def num_accepted(self) -> int:
        return len(self._history)

    def text(self) -> str:
        return self.tokenizer.decode([t for t in self._history if t >= 0],
                                     skip_special_tokens=True)

    def overhead_us_per_token(self) -> float:
        """Mean microseconds spent in mask + advance per advanced token so far."""
        n = max(self.counters.advances, 1)
        return 1e6 * (self.counters.mask_s + self.counters.advance_s) / n

    def reset(self) -> None:
        self._matcher.reset()
        self._history.clear()
        self._forced = None
