"""A tiny random model made to write a script: a logit processor that pushes the text `script(prompt)`.

`scripted(monkeypatch, tokenizer, script)` swaps the engine's per-request logit processors
(asymagent/decoding/logit_processors.py) for one that adds +1000 to the token that continues the
text `script(prompt_text)` wherever the output so far is a prefix of it (decoded text, so any
tokenisation the constraint's jump-forward picks still follows), and to the stop token once the
text is written; elsewhere the random model decides. The constraint's masks apply after the
processors (asymagent/decoding/round.py), so a scripted token the grammar forbids is not
emitted: this is how a test makes a model "want" to echo `<tools>` or double its braces.
"""

from __future__ import annotations

from asymagent.decoding.logit_processors import LogitProcessors

PUSH = 1000.0


class ScriptedProcessors(LogitProcessors):
    """LogitProcessors that push a scripted text (module docstring)."""

    tokenizer = None
    script = None

    @property
    def penalises(self) -> bool:
        return True

    def penalise(self, rows, generated: list, drafts: list):
        out = super().penalise(rows, generated, drafts) if super().penalises else rows.clone()
        want = self.script(self.tokenizer.decode(list(self.prompt_ids)))
        for i in range(out.shape[0]):
            prefix = list(generated) + list(drafts[:i])
            text = self.tokenizer.decode(prefix)
            if text == want:
                out[i, self.stop_id] += PUSH
            elif want.startswith(text):
                ids = self.tokenizer.encode(want[len(text):], add_special_tokens=False)
                if ids and ids[0] < out.shape[1]:
                    out[i, ids[0]] += PUSH
        return out


def scripted(monkeypatch, tokenizer, script, stop_token: str = "<|im_end|>") -> None:
    """Every request of this process writes `script(prompt_text)` (module docstring)."""
    stop_id = tokenizer.convert_tokens_to_ids(stop_token)
    original = LogitProcessors.of.__func__

    def of(cls, sampling, prompt_ids=()):
        base = original(LogitProcessors, sampling, prompt_ids)
        proc = ScriptedProcessors(**{k: getattr(base, k) for k in base.__dataclass_fields__})
        proc.prompt_ids = tuple(prompt_ids)
        proc.tokenizer, proc.script, proc.stop_id = tokenizer, script, stop_id
        return proc

    monkeypatch.setattr(LogitProcessors, "of", classmethod(of))
