"""SpecConfig (every knob of the draft-verify loop, each default explained) and the table of modes.

The algorithm these knobs steer is in docs/architecture.md ("The algorithm").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from asymagent.kernels import ACCEPTANCE_RULES


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

    Defaults: the paper's K=2 drafts per round and beta=1.0 delta-fusion weight, with two changes
    chosen on dev seeds (docs/results.md, "Tuning"): acceptance "greedy" (the fused target
    decides every token, so drafts and K change speed only, never the output; the paper's
    relaxed "cda" gate lost fidelity to full on every dev workload without a speed gain on this
    verifier/drafter pair) and prompt-lookup drafts from the full view (lookup_ngram=3), which
    verify 3-6 tokens per forward on agent turns. Adaptive K is on (also chosen on measurements,
    docs/results.md "Tuning"): it switches speculation off within a request when it
    measurably loses, which it does on short chat with nothing to copy. In spec that changes
    speed only; in asym the plain steps skip delta-fusion (the verifier alone on the compressed
    view), which left every output unchanged where it was measured. `SpecConfig.paper()` is the paper's setting (cda, gamma=0.5, no
    lookup, fixed K).
    """

    k: int = 2  # draft tokens per round; the verifier scores K+1 positions in one forward
    beta: float = 1.0  # weight of delta = log p_drafter(full) - log p_drafter(compressed)
    gamma: float = 0.5  # accept d iff p_v(d) > gamma*exp(-JSD)*p_base(d)  (cda)
    # "cda" (paper, relaxed), "exact" (rejection sampling), "greedy" (argmax match; at
    # temperature > 0 the engine runs it as "exact", so the fused target is sampled, not argmaxed)
    acceptance: str = "greedy"
    strict_prefix: int = 0  # first N tokens of each response use exact/greedy instead of cda
    escalate_jsd: float | None = None  # running-mean JSD above this -> finish with full verifier
    escalate_window: int = 4  # rounds in the running mean used by escalate_jsd
    adaptive_k: bool = True  # tune K from observed acceptance; turn speculation off if it loses
    k_min: int = 1  # adaptive K lower bound
    k_max: int = 8  # adaptive K upper bound
    fuse_bonus: bool = True  # fuse at K+1 when every draft passes (False = official code)
    spec_acceptance: str = "exact"  # rule used by mode `spec` (lossless against the verifier)
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

    @classmethod
    def paper(cls, **overrides) -> "SpecConfig":
        """AsymSpec's published gate and knobs: K=2, beta=1, gamma=0.5, cda, no prompt lookup.

        We fuse the K+1 position too; `SpecConfig.paper(fuse_bonus=False)` is the official code's
        rule exactly (the verifier's own argmax there)."""
        return cls(**{"k": 2, "beta": 1.0, "gamma": 0.5, "acceptance": "cda", "lookup_ngram": 0,
                      "adaptive_k": False, **overrides})

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"SpecConfig.k must be an integer >= 1, got {self.k!r}")
        if self.acceptance not in ACCEPTANCE_RULES:
            raise ValueError(
                f"SpecConfig.acceptance must be one of {ACCEPTANCE_RULES}, got {self.acceptance!r}"
            )
        if self.spec_acceptance not in ("exact", "greedy"):
            raise ValueError("SpecConfig.spec_acceptance must be 'exact' or 'greedy'")
        if not (0.0 < self.gamma <= 1.0):
            raise ValueError(f"SpecConfig.gamma must be in (0, 1], got {self.gamma!r}")
        if self.beta < 0:
            raise ValueError(f"SpecConfig.beta must be >= 0, got {self.beta!r}")
        if self.strict_prefix < 0:
            raise ValueError("SpecConfig.strict_prefix must be >= 0")
        if self.escalate_jsd is not None and not (0.0 < self.escalate_jsd):
            raise ValueError("SpecConfig.escalate_jsd must be > 0 (natural-log JSD) or None")
        if not isinstance(self.lookup_ngram, int) or self.lookup_ngram < 0:
            raise ValueError(f"SpecConfig.lookup_ngram must be an integer >= 0, got {self.lookup_ngram!r}")
        if not isinstance(self.lookup_k, int) or self.lookup_k < 1:
            raise ValueError(f"SpecConfig.lookup_k must be an integer >= 1, got {self.lookup_k!r}")
        if self.suffix_factor <= 0 or not (0.0 <= self.suffix_min_prob <= 1.0) or self.suffix_max_depth < 2:
            raise ValueError("SpecConfig needs suffix_factor > 0, 0 <= suffix_min_prob <= 1, "
                             "suffix_max_depth >= 2")
        if not (1 <= self.k_min <= self.k_max):
            raise ValueError("SpecConfig needs 1 <= k_min <= k_max")

    def rule_for(self, mode: Mode, position: int, temperature: float) -> str:
        """The acceptance rule of a round whose first draft lands at output `position`.

        Mode spec uses `spec_acceptance` (lossless); asym uses `acceptance`, except within the
        first `strict_prefix` tokens, where it is exact/greedy. "greedy" at temperature > 0 means
        "the target decides, sampled": rejection sampling, i.e. "exact".
        """
        if mode.fused and position < self.strict_prefix:
            rule = "exact" if temperature > 0 else "greedy"
        else:
            rule = self.acceptance if mode.fused else self.spec_acceptance
        return "exact" if rule == "greedy" and temperature > 0 else rule

    def to_dict(self) -> dict:
        return asdict(self)
