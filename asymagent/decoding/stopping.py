"""Stopping: EOS token ids of a model/tokenizer and stop strings over the generated tokens."""

from __future__ import annotations


def eos_ids(model, tokenizer) -> set:
    """EOS ids from the generation config, model config and tokenizer, plus ChatML's `<|im_end|>`
    and, beside it, `<|endoftext|>`: a chat model that writes the document's end has ended its
    turn (Qwen2.5's generation config lists both; its GGUF keeps only `<|im_end|>`, and the pair's
    1.5B then wrote on past `<|endoftext|>` into an invented next turn)."""
    ids: set = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    if tokenizer is not None:
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(im_end, int) and im_end != getattr(tokenizer, "unk_token_id", None):
            ids.add(im_end)
            text_end = tokenizer.convert_tokens_to_ids("<|endoftext|>")
            if isinstance(text_end, int) and text_end != getattr(tokenizer, "unk_token_id", None):
                ids.add(text_end)
    return ids


class StopChecker:
    """EOS ids and stop strings: how many of the new tokens to keep, and whether to stop."""

    def __init__(self, eos_ids: set, stop: list, tokenizer) -> None:
        self.eos_ids, self.stop, self.tokenizer = eos_ids, stop, tokenizer

    def first_stop(self, generated: list, start: int) -> int | None:
        """Tokens to keep if generated[start:] completes a stop (EOS kept, stop string cut)."""
        for i in range(start, len(generated)):
            if generated[i] in self.eos_ids:
                return i + 1
        if self.stop:
            # a stop string completed by the new tokens starts at most max(len(s)) tokens back
            # (every token decodes to >= 1 character), so only that window is decoded
            lo = max(0, start - max(len(s) for s in self.stop))
            text = self.tokenizer.decode(generated[lo:], skip_special_tokens=False)
            if any(s in text for s in self.stop):
                for n in range(start + 1, len(generated) + 1):  # shortest prefix with a stop
                    part = self.tokenizer.decode(generated[lo:n], skip_special_tokens=False)
                    if any(s in part for s in self.stop):
                        return n
        return None

    def text(self, token_ids: list) -> str:
        if self.tokenizer is None:
            return ""
        ids = token_ids[:-1] if token_ids and token_ids[-1] in self.eos_ids else token_ids
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        cuts = [text.find(s) for s in self.stop if s in text]
        return text[: min(cuts)] if cuts else text
