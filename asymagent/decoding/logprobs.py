"""Per-token log-probabilities of the verifier's own rows (OpenAI `logprobs` / `top_logprobs`).

What is reported: `log_softmax` of the verifier's raw logits at the position that produced the
token, at temperature 1, before constraint masks, top-p/top-k/min-p, penalties and logit bias
(vLLM's default, "raw logprobs"). The verifier reads its own view: in modes full and spec that
is the full context (in spec the gate's target, so the reported distribution is the one sampled
from at temperature 1); in compressed and asym it is the compressed view (in asym the token
itself was chosen from the fused target `v + beta * (a - b)`, so a token can have a lower
reported log-probability than the verifier's top choice); after an escalation, the full view.

Tokens emitted without a verifier forward (jump-forward under a constraint) are scored by the
next forward, which feeds them anyway; any left at the end get one more forward (`Decoder.
score_pending`), so every emitted token has the verifier's row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from asymagent.kv.cache import ModelCache

MAX_TOP = 20  # OpenAI's limit on top_logprobs


@dataclass
class TokenLogprob:
    """One emitted token: its id, log p_verifier(token), and the `top` most likely ids."""

    token_id: int
    logprob: float | None  # None only for a scored prompt's first token (nothing predicts it)
    top: list = field(default_factory=list)  # [(token_id, logprob)], most likely first


class LogprobRecorder:
    """Collects one TokenLogprob per generated token, in order (`entries[i]` <-> generated[i]).

    `top` alternatives are kept per token (0..MAX_TOP). `record(rows, tokens)` scores the next
    `len(tokens)` generated positions with the verifier's rows for them ([R, V] raw logits).
    """

    def __init__(self, top: int = 0):
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP:
            raise ValueError(f"top logprobs must be an integer in [0, {MAX_TOP}], got {top!r}")
        self.top = top
        self.entries: list[TokenLogprob] = []

    @property
    def scored(self) -> int:
        """Generated positions scored so far."""
        return len(self.entries)

    def record(self, rows: torch.Tensor, tokens: list) -> None:
        """Score the next len(tokens) positions: rows [R, V] predict tokens[0..R-1] (R = len)."""
        if not tokens:
            return
        logp = torch.log_softmax(rows.float(), dim=-1)  # [R, V]
        ids = torch.tensor(tokens, device=logp.device)  # [R]
        chosen = logp.gather(1, ids[:, None])[:, 0].tolist()  # [R]
        tops = [[] for _ in tokens]
        if self.top:
            values, indices = logp.topk(self.top, dim=-1)  # [R, top]
            tops = [list(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())]
        for t, lp, top in zip(tokens, chosen, tops):
            self.entries.append(TokenLogprob(int(t), float(lp), top))

    def truncate(self, n: int) -> None:
        """Keep the first `n` entries (the tokens a stop string or a constraint cut away go)."""
        del self.entries[n:]


@torch.inference_mode()
def score_tokens(model, ids: list, top: int = 0, chunk: int = 256) -> list:
    """log p_model(ids[t] | ids[<t]) for every t, as TokenLogprobs (the first has logprob None).

    A fresh cache (nothing shared with decoding), fed `chunk` tokens at a time, so at most
    [chunk, V] logits exist at once. What `/v1/completions` with `echo` reports for a prompt.
    """
    recorder = LogprobRecorder(top)
    cache = ModelCache(model)
    for start in range(0, len(ids) - 1, chunk):
        piece = ids[start:start + chunk]
        rows = cache.forward_logits(piece, keep=len(piece))  # [T, V], row t predicts piece t+1
        targets = ids[start + 1:start + 1 + len(piece)]
        recorder.record(rows[: len(targets)], targets)
    return [TokenLogprob(int(ids[0]), None)] + recorder.entries if ids else []
