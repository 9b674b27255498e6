"""Engine log-probs (TokenLogprob, asymagent/decoding/logprobs.py) in OpenAI's two wire shapes.

Chat (`choices[].logprobs.content`): one `{"token", "logprob", "bytes", "top_logprobs"}` per
token. Completions (`choices[].logprobs`): parallel lists `tokens`, `token_logprobs`,
`top_logprobs` (one `{token: logprob}` dict per token) and `text_offset`. A token's text and
bytes come from its vocabulary entry: byte-level BPE vocabularies (GPT-2 style, SmolLM2's) map
back to the exact bytes, so a token holding half a UTF-8 character reports its real bytes (its
text shows U+FFFD); other tokenizers fall back to decoding the token alone. A trailing stop
token (EOS, `<|im_end|>`) is not part of the text and is left out, as OpenAI does.
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def _byte_decoder() -> dict:
    """GPT-2's printable-character -> byte table (the inverse of `bytes_to_unicode`)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, n = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class TokenTexts:
    """token id -> (text, bytes) for one tokenizer (cached per id)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            piece = self.tokenizer.convert_ids_to_tokens(int(token_id))
            table = _byte_decoder()
            if isinstance(piece, str) and piece and all(ch in table for ch in piece):
                raw = bytes(table[ch] for ch in piece)
                hit = (raw.decode("utf-8", errors="replace"), list(raw))
            else:
                text = self.tokenizer.decode([int(token_id)])
                hit = (text, list(text.encode("utf-8")))
            if len(self._cache) < 65536:
                self._cache[token_id] = hit
        return hit


def visible(entries: list | None, stop_ids) -> list:
    """The entries of the text's tokens: a trailing stop token dropped."""
    entries = list(entries or [])
    if entries and entries[-1].token_id in set(stop_ids or ()):
        entries.pop()
    return entries


def chat_content(texts: TokenTexts, entries: list) -> list[dict]:
    """OpenAI chat `logprobs.content` for `entries`."""
    out = []
    for e in entries:
        text, raw = texts(e.token_id)
        top = []
        for tid, lp in e.top:
            t, b = texts(tid)
            top.append({"token": t, "logprob": lp, "bytes": b})
        out.append({"token": text, "logprob": e.logprob, "bytes": raw, "top_logprobs": top})
    return out


def completion_logprobs(texts: TokenTexts, entries: list, offset: int = 0) -> dict:
    """OpenAI completions `logprobs` for `entries` (logprob None: an echoed prompt's first
    token, which nothing predicts); text offsets start at `offset` characters."""
    tokens, token_lps, tops, offsets = [], [], [], []
    for e in entries:
        text = texts(e.token_id)[0]
        tokens.append(text)
        token_lps.append(e.logprob)
        tops.append(None if e.logprob is None else {texts(t)[0]: lp for t, lp in e.top})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops,
            "text_offset": offsets}
