"""SpecConfig (every knob of the draft-verify loop, each default explained) and the table of modes.

The algorithm these knobs steer is in docs/architecture.md ("The algorithm").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from asymagent.kernels import ACCEPTANCE_RULES as GATE_RULES

# The gate's rules plus "coupled" (Gumbel-max coupling: the gate's greedy rule on rows perturbed
# with position-keyed Gumbel noise; asymagent/decoding/round.py).
ACCEPTANCE_RULES = GATE_RULES + ("coupled",)
SPEC_RULES = ("greedy", "exact", "coupled")  # lossless against the verifier (mode spec)
COPY_RULES = ("removed", "unseen")  # when the copy delta applies (asymagent/decoding/copy_delta.py)
# What "greedy" ("the target decides") runs as at temperature > 0. Coupled: the output is the
# verifier's (fused target's) Gumbel-max sample at every position, identical to mode full under
# the same seed whatever K, adaptive K or the drafts do; its acceptance cost against "exact" on
# the bench is in docs/engine.md ("Sampling": python -m asymagent.evals.probes.coupling_cost).
SAMPLED_GREEDY = "coupled"


@dataclass(frozen=True)
class Mode:
    """What a decoding mode reads and runs (the one table every layer asks)."""

    name: str
    compressed: bool  # the verifier reads the compressed view (else the full one)
    speculative: bool  # a drafter proposes tokens that the verifier checks in one forward
    fused: bool  # the drafter's two views steer the verifier (delta-fusion, JSD gate): asym


MODE_TABLE = {m.name: m for m in (
    Mode("full", compressed=False, speculative=False, fused=False),  # verifier alone, full view
    Mode("compressed", compressed=True, speculative=False, fused=False),  # verifier alone
    Mode("spec", compressed=False, speculative=True, fused=False),  # lossless speculation
    Mode("asym", compressed=True, speculative=True, fused=True),  # the algorithm
)}
MODES = tuple(MODE_TABLE)


def mode_of(name: str) -> Mode:
    """The Mode called `name`; a ValueError naming the modes otherwise."""
    if name not in MODE_TABLE:
        raise ValueError(f"unknown mode {name!r}; expected one of {MODES}")
    return MODE_TABLE[name]


@dataclass
class SpecConfig:
    """Configuration of speculative decoding (modes `spec` and `asym`).

    Defaults: the paper's K=2 drafts per round; the fused target of mode asym is the compressed
    verifier plus the copy delta (copy_weight 6; the drafter model's delta, beta, is off: it
    measured harmful, docs/drafter.md); acceptance "greedy" (the fused target decides every
    token, so drafts and K change speed only, never the output; the paper's relaxed "cda" gate
    lost fidelity to full on every dev workload without a speed gain on this verifier/drafter
    pair, docs/log.md "Tuning"); copied drafts by suffix matching (SuffixDecoding: the full view
    and the engine's store of earlier responses, lookup_ngram=3, suffix=True, up to lookup_k=16
    tokens), tried before the drafter model each round (4.5-6.3 tokens per verifier forward on
    the bench workload: docs/results/suffix_drafts.json, bench_copy_delta.json; `suffix=False`
    is plain prompt lookup). At temperature > 0 "greedy" runs as the
    coupled rule (Gumbel-max coupling), so the output is the target's sample under the seed
    whatever K is (`position_invariant`). Adaptive K is on (chosen on measurements, docs/log.md
    "Adaptive K"): it switches speculation off within a request when it measurably loses,
    which it does on short chat with nothing to copy. It changes speed only: asym fuses its
    plain steps too, and rules whose output depends on K keep K fixed.
    `SpecConfig.paper()` is the paper's setting (cda, beta=1, gamma=0.5, no copied drafts, no
    copy delta, fixed K).
    """

    k: int = 2  # draft tokens per round; the verifier scores K+1 positions in one forward
    # weight of the drafter model's delta = log p_drafter(full) - log p_drafter(compressed).
    # 0 by default since issue 16: the shipped drafter's delta moved the target AWAY from the
    # full-context verifier on every suite (recovered share -0.019 on test seeds, docs/drafter.md);
    # a drafter trained for it (train-drafter --objective fusion) may set it again
    beta: float = 0.0
    # the divergence gate on that delta: applied only at positions where the drafter's two views
    # disagree, beta_eff = beta * [JSD(p_drafter(full) || p_drafter(compressed)) >= jsd_min]
    # (natural log, so at most ln 2 ~ 0.693: jsd_min above it never fires and asym decodes as
    # mode compressed plus the copy delta); elsewhere the target is the verifier's own row. 0 (the
    # default) keeps plain delta-fusion bit for bit: the lead picks the (beta, jsd_min) pair;
    # measured on dev seeds with `asymagent eval fusion` (docs/drafter.md, "The divergence gate")
    jsd_min: float = 0.0
    # weight of the copy delta (asym on a compressed view; asymagent/decoding/copy_delta.py):
    # log((1 + c_F) / (1 + c_C)) on the continuations of the longest repeated suffix that only
    # the full view's removed text holds; 0 turns it off. 6 and min length 3 chosen on dev seeds
    # (`asymagent eval fusion --split dev`, docs/evals.md)
    copy_weight: float = 6.0
    copy_min_len: int = 3  # shortest repeated suffix the copy delta counts continuations of
    # when the copy delta applies (copy_delta.RULES): "unseen" (the default since issue 26's
    # 2026-12-05 measurement) only where the compressed view holds no occurrence of the match (the
    # verifier has no copy source of its own there); "removed" (before) wherever the full view's
    # match has continuations only its removed text holds. Dev seeds: top-1 agreement with the
    # full-view verifier 0.959 vs 0.957, fixed / broken positions 20 / 7 vs 21 / 12 (docs/context.md)
    copy_rule: str = "unseen"
    gamma: float = 0.5  # accept d iff p_v(d) > gamma*exp(-JSD)*p_base(d)  (cda)
    # "cda" (paper, relaxed), "exact" (rejection sampling), "coupled" (Gumbel-max coupling: the
    # draft is accepted iff it equals the target's Gumbel-max sample at its position), "greedy"
    # (argmax match; at temperature > 0 the engine runs it as SAMPLED_GREEDY = "coupled", so
    # the fused target is sampled, not argmaxed)
    acceptance: str = "greedy"
    strict_prefix: int = 0  # first N tokens of each response use exact/greedy instead of cda
    escalate_jsd: float | None = None  # running-mean JSD above this -> finish with full verifier
    escalate_window: int = 4  # rounds in the running mean used by escalate_jsd
    # tune K from observed acceptance and timings; turn speculation off if it loses. Applied
    # only where K cannot change the output (`position_invariant`: the defaults); with cda,
    # exact at T > 0, fuse_bonus=False or escalate_jsd K stays fixed (same seed, same output)
    adaptive_k: bool = True
    k_min: int = 1  # adaptive K lower bound
    k_max: int = 8  # adaptive K upper bound
    fuse_bonus: bool = True  # fuse at K+1 when every draft passes (False = official code)
    spec_acceptance: str = "greedy"  # rule of mode `spec` (lossless against the verifier): SPEC_RULES
    # Copied drafts (tried before the drafter model each round): lookup_ngram > 0 turns them on;
    # `suffix` picks SuffixDecoding (asymagent/decoding/suffix_drafter.py: the full view and the
    # engine's store of earlier responses, frequency-scored, draft length adaptive to the match)
    # over plain prompt lookup (the latest earlier occurrence of the last lookup_ngram..2 tokens)
    lookup_ngram: int = 3  # >0: copied drafts on; prompt lookup's longest suffix n-gram
    lookup_k: int = 16  # max copied drafts per round (verified in the same single forward)
    suffix: bool = True  # copied drafts by suffix matching (False: prompt lookup)
    suffix_factor: float = 4.0  # a match of m tokens drafts at most suffix_factor * m tokens
    suffix_min_prob: float = 0.1  # stop a path where its estimated probability falls below this
    suffix_max_depth: int = 32  # longest context suffix matched
    # False: the drafter model proposes no drafts; rounds draft from copies only (suffix / prompt
    # lookup; none: plain steps). With nothing else reading it (beta 0, no cda, no escalate_jsd)
    # the drafter model then never runs, neither its full-view prefill nor its steps. For a
    # drafter model whose prefill of the whole history costs more than its drafts save: on agent
    # steps (long contexts, short outputs) a 0.5B LM drafter reads ~1/3 of a 1.5B verifier's bytes
    # per token of the full view (docs/pair.md). beta > 0 or cda still run it for their rows.
    draft_model: bool = True
    # the engine's EAGLE-3 feature head (Engine.use_feature_head) drafts the rounds that find no
    # copy; False: not asked (an engine without one ignores it). Lossless like every draft source.
    feature_head: bool = True

    @classmethod
    def paper(cls, **overrides) -> "SpecConfig":
        """AsymSpec's published gate and knobs: K=2, beta=1, gamma=0.5, cda, no prompt lookup.

        We fuse the K+1 position too; `SpecConfig.paper(fuse_bonus=False)` is the official code's
        rule exactly (the verifier's own argmax there)."""
        return cls(**{"k": 2, "beta": 1.0, "gamma": 0.5, "acceptance": "cda", "lookup_ngram": 0,
                      "adaptive_k": False, "copy_weight": 0.0, **overrides})

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"SpecConfig.k must be an integer >= 1, got {self.k!r}")
        if self.acceptance not in ACCEPTANCE_RULES:
            raise ValueError(
                f"SpecConfig.acceptance must be one of {ACCEPTANCE_RULES}, got {self.acceptance!r}"
            )
        if self.spec_acceptance not in SPEC_RULES:
            raise ValueError(f"SpecConfig.spec_acceptance must be one of {SPEC_RULES}, "
                             f"got {self.spec_acceptance!r}")
        if not (0.0 < self.gamma <= 1.0):
            raise ValueError(f"SpecConfig.gamma must be in (0, 1], got {self.gamma!r}")
        if self.beta < 0:
            raise ValueError(f"SpecConfig.beta must be >= 0, got {self.beta!r}")
        if not (isinstance(self.jsd_min, (int, float)) and math.isfinite(self.jsd_min)
                and self.jsd_min >= 0):
            raise ValueError(f"SpecConfig.jsd_min must be a finite number >= 0, got {self.jsd_min!r}")
        if not self.copy_weight >= 0:
            raise ValueError(f"SpecConfig.copy_weight must be >= 0, got {self.copy_weight!r}")
        if self.copy_rule not in COPY_RULES:
            raise ValueError(f"SpecConfig.copy_rule must be one of {COPY_RULES}, got {self.copy_rule!r}")
        if not isinstance(self.copy_min_len, int) or self.copy_min_len < 1:
            raise ValueError(f"SpecConfig.copy_min_len must be an integer >= 1, got {self.copy_min_len!r}")
        if self.strict_prefix < 0:
            raise ValueError("SpecConfig.strict_prefix must be >= 0")
        if self.escalate_jsd is not None and not (0.0 < self.escalate_jsd):
            raise ValueError("SpecConfig.escalate_jsd must be > 0 (natural-log JSD) or None")
        if not isinstance(self.lookup_ngram, int) or self.lookup_ngram < 0:
            raise ValueError(f"SpecConfig.lookup_ngram must be an integer >= 0, got {self.lookup_ngram!r}")
        if not isinstance(self.lookup_k, int) or self.lookup_k < 1:
            raise ValueError(f"SpecConfig.lookup_k must be an integer >= 1, got {self.lookup_k!r}")
        for name in ("adaptive_k", "fuse_bonus", "draft_model", "feature_head"):  # a string "False" would be truthy
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"SpecConfig.{name} must be True or False, got {getattr(self, name)!r}")
        if self.suffix_factor <= 0 or not (0.0 <= self.suffix_min_prob <= 1.0) or self.suffix_max_depth < 2:
            raise ValueError("SpecConfig needs suffix_factor > 0, 0 <= suffix_min_prob <= 1, "
                             "suffix_max_depth >= 2")
        if not (1 <= self.k_min <= self.k_max):
            raise ValueError("SpecConfig needs 1 <= k_min <= k_max")

    def rule_for(self, mode: Mode, position: int, temperature: float) -> str:
        """The acceptance rule of a round whose first draft lands at output `position`.

        Mode spec uses `spec_acceptance` (lossless); asym uses `acceptance`, except within the
        first `strict_prefix` tokens, where it is "greedy". "greedy" means "the target decides":
        the argmax at temperature 0, SAMPLED_GREEDY ("coupled") at temperature > 0. At
        temperature 0 "exact" and "coupled" are the greedy rule too.
        """
        if mode.fused and position < self.strict_prefix:
            rule = "greedy"
        else:
            rule = self.acceptance if mode.fused else self.spec_acceptance
        if temperature <= 0.0:
            return rule if rule == "cda" else "greedy"
        return SAMPLED_GREEDY if rule == "greedy" else rule

    def position_invariant(self, mode: Mode, temperature: float) -> bool:
        """True when every token is the (fused) target's argmax / Gumbel-max at its position.

        Then the output does not depend on K, adaptive K (which reads wall-clock timings),
        copied drafts or which positions plain steps took: same seed, same output, whatever
        the timings. cda and exact decide per round (the round's layout is part of the rule),
        fuse_bonus=False treats the bonus position differently and escalate_jsd switches on
        a per-round mean; with those the decode loop keeps K fixed even when adaptive_k is on,
        and suffix drafting copies from the request's own full view only (not from the
        engine's store of earlier responses, which other requests fill).
        """
        if not mode.speculative:
            return True
        rules = {self.rule_for(mode, p, temperature) for p in (0, self.strict_prefix)}
        if not rules <= {"greedy", "coupled"}:
            return False
        return not mode.fused or (self.fuse_bonus and self.escalate_jsd is None)

    def to_dict(self) -> dict:
        return asdict(self)
