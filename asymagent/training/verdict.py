"""The closing verdict of `train-drafter`: the trained drafter against what needs no training.

After a run, on the held-out episodes (a domain never trained on), three draft sources are
scored against the verifier's greedy token at every position (teacher-forced):

- the trained drafter (its top-1 over the full vocabulary),
- `layers:N`: the verifier's first N layers with its own norm and head, untrained (what
  `serve --drafter layers:N` builds), N the run's `--layers`,
- the suffix drafts alone: the token that followed the latest earlier occurrence of the longest
  1..4-token suffix of the text so far (prompt lookup, `lookup_continuation`; a position with
  no match counts as a miss).

Top-1 agreement `a` is the chance a greedy round accepts a draft token; with K drafts per round
a round accepts `a + a^2 + ... + a^K` tokens on average if agreement were independent of the
position (the expected accepted drafts per round, greedy). `verdict` says plainly which source
is best and says plainly when the trained drafter is worse than `layers:N` (then: serve with
that) or than the suffix drafts alone (then it adds little: rounds try suffix drafts first).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asymagent.decoding.lookup_drafter import lookup_continuation


@dataclass
class Verdict:
    """Held-out top-1 agreement of each draft source, and the closing line."""

    trained: float
    layers: float
    suffix: float
    n_layers: int
    k: int
    tokens: int

    def per_round(self, agreement: float) -> float:
        """Expected accepted drafts per greedy round of K drafts at this agreement."""
        return sum(agreement ** i for i in range(1, self.k + 1))

    def line(self) -> str:
        """One plain sentence: the three figures, then which to use."""
        figures = (f"held-out ({self.tokens} tokens) top-1 agreement with the verifier: trained drafter "
                   f"{self.trained:.1%} (~{self.per_round(self.trained):.2f} drafts accepted per round at "
                   f"K={self.k}), untrained layers:{self.n_layers} {self.layers:.1%} "
                   f"(~{self.per_round(self.layers):.2f}), suffix drafts alone {self.suffix:.1%} "
                   f"(~{self.per_round(self.suffix):.2f})")
        if self.trained >= max(self.layers, self.suffix):
            return f"{figures}. The trained drafter is the best of the three: use it."
        advice = []
        if self.trained < self.layers:
            advice.append(f"WORSE than the untrained layers:{self.n_layers}: serve with --drafter "
                          f"layers:{self.n_layers} instead")
        if self.trained < self.suffix:
            advice.append("WORSE than the suffix drafts alone (which every speculative round tries "
                          "before the drafter model): this drafter adds little")
        return f"{figures}. " + "; ".join(advice) + ". Train longer (--max-minutes) or on data " \
            "closer to your traffic (--traces)."

    def as_card(self) -> dict:
        return {"heldout_top1_agreement_layers_untrained": round(self.layers, 4),
                "heldout_top1_agreement_suffix_only": round(self.suffix, 4),
                "drafter_beats_baselines": self.trained >= max(self.layers, self.suffix)}


@torch.no_grad()
def teacher_argmax(verifier, seqs: list) -> list:
    """The verifier's greedy next token at every position of each sequence ([T] tensors)."""
    return [verifier(input_ids=torch.tensor([seq])).logits[0].argmax(-1) for seq in seqs]


@torch.no_grad()
def drafter_agreement(drafter, seqs: list, targets: list) -> float:
    """Share of positions where the drafter's top-1 (full vocabulary) is the verifier's token."""
    hits = total = 0
    for seq, t in zip(seqs, targets):
        hidden = drafter.model(input_ids=torch.tensor([seq])).last_hidden_state[0]  # [T, H]
        hits += int((drafter.lm_head(hidden).argmax(-1) == t).sum())
        total += len(seq)
    return hits / max(total, 1)


def suffix_agreement(seqs: list, targets: list, max_ngram: int = 4) -> float:
    """Share of positions where the copied continuation of the text so far is the verifier's token."""
    hits = total = 0
    for seq, t in zip(seqs, targets):
        want = t.tolist()
        for i in range(len(seq)):
            draft = lookup_continuation(seq[:i + 1], max_ngram=max_ngram, k=1, min_ngram=1)
            hits += bool(draft) and draft[0] == want[i]
        total += len(seq)
    return hits / max(total, 1)


def judge(verifier, trained, seqs: list, n_layers: int, k: int) -> Verdict:
    """Score the three draft sources on `seqs` (token id lists); `trained` is in eval mode."""
    from asymagent.modeling.drafter import build_drafter

    targets = teacher_argmax(verifier, seqs)
    baseline = build_drafter(verifier, n_layers, init_from_verifier=True).eval()
    return Verdict(trained=drafter_agreement(trained, seqs, targets),
                   layers=drafter_agreement(baseline, seqs, targets),
                   suffix=suffix_agreement(seqs, targets), n_layers=n_layers, k=k,
                   tokens=sum(len(s) for s in seqs))
