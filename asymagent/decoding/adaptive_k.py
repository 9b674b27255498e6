"""Adaptive K: pick the draft length from measured acceptance and forward costs, or stop drafting.

Model (one request): drafts are accepted i.i.d. with probability alpha, so a round with K
drafts emits E(K) = sum_{i=0..K} alpha^i tokens; it costs K * t_draft (drafter + base forwards
per draft) + t_verify(K) (verifier forward over K+1 positions, plus the gate). A plain verifier
step emits 1 token for t_plain. We choose K in [k_min, k_max] maximising E(K) / cost(K), and
switch speculation off for the rest of the request when even the best K is measurably slower
than plain decoding (rate below (1 - margin) * 1/t_plain, after `min_rounds` measured rounds).

Everything is measured in the request itself: alpha from the gate's verdicts (Laplace prior,
(accepted + 1) / (reached + 2)), t_draft and t_verify(K) as running means of the rounds'
timings, t_plain from plain probe steps that `DraftChoice.want_probe` schedules (once a source is
one round from being judged, and again every `probe_every` rounds, since contexts grow).
t_verify(K) for a K not tried yet is extrapolated on the line through (0, t_plain) and the
measured points.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens per round with K drafts and i.i.d. acceptance alpha: sum_{i<=K} alpha^i."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def running_mean(old: float | None, new: float, weight: float) -> float:
    """Exponential running mean; the first value starts it."""
    return new if old is None else (1 - weight) * old + weight * new


@dataclass
class AdaptiveK:
    k: int  # current choice
    k_min: int = 1
    k_max: int = 8
    margin: float = 0.10  # "measurably slower": more than 10% below the plain rate
    min_rounds: int = 4  # speculative rounds measured before speculation may be switched off
    probe_every: int = 32  # rounds between plain probe steps refreshing t_plain
    ema: float = 0.3  # weight of the newest timing in the running means
    enabled: bool = True  # False once speculation was switched off for this request
    accepted: int = 0
    reached: int = 0
    rounds: int = 0
    t_draft: float | None = None  # seconds per draft token (drafter + base pass)
    t_plain: float | None = None  # seconds per plain verifier step
    t_verify: dict = field(default_factory=dict)  # K -> seconds per verify (forward + gate)

    def _mix(self, old: float | None, new: float) -> float:
        return running_mean(old, new, self.ema)

    def record_plain(self, seconds: float) -> None:
        self.t_plain = self._mix(self.t_plain, seconds)

    def record_round(self, k: int, accepted: int, draft_s: float, verify_s: float) -> None:
        self.rounds += 1
        self.accepted += accepted
        self.reached += accepted + (1 if accepted < k else 0)
        self.t_draft = self._mix(self.t_draft, draft_s / max(k, 1))
        self.t_verify[k] = self._mix(self.t_verify.get(k), verify_s)
        self._choose()

    @property
    def alpha(self) -> float:
        return (self.accepted + 1) / (self.reached + 2)

    def verify_cost(self, k: int) -> float:
        if k in self.t_verify:
            return self.t_verify[k]
        known = sorted(self.t_verify.items())
        if self.t_plain is None:  # no slope yet: the nearest measured K
            return min(known, key=lambda kv: abs(kv[0] - k))[1]
        slopes = [(t - self.t_plain) / kk for kk, t in known]
        return max(self.t_plain + max(0.0, sum(slopes) / len(slopes)) * k, 0.0)

    def rate(self, k: int) -> float:
        """Expected tokens per second of rounds with K drafts."""
        cost = k * (self.t_draft or 0.0) + self.verify_cost(k)
        return expected_tokens(self.alpha, k) / max(cost, 1e-9)

    def _choose(self) -> None:
        best = max(range(self.k_min, self.k_max + 1), key=self.rate)
        self.k = best
        if (self.t_plain is not None and self.rounds >= self.min_rounds
                and self.rate(best) < (1.0 - self.margin) / self.t_plain):
            self.enabled = False


@dataclass
class DraftChoice:
    """Which drafter a step uses: copied drafts (suffix/lookup), the drafter model, or none (plain).

    The three compete on what they measured in this request: copied-draft rounds as tokens per
    second of their own rounds (a running mean; they cost no drafter forward, only the verify),
    model rounds through `AdaptiveK.rate(k)`, plain steps as 1 / t_plain (probe steps). A source
    whose rate stays measurably below the best of the others (`margin`, after `min_rounds` of
    its rounds) is switched off for the rest of the request; with both off the step is plain.
    Copied drafts are asked first each round (they are free to propose); the model drafts when
    they have nothing. `budgets(k, copy_k)` is what `Decoder.spec_round` gets; the plain probe
    (`want_probe`) runs when a source is one round from its judgment, then every `probe_every`
    rounds.
    """

    model: AdaptiveK
    copy_names: tuple = ("suffix", "lookup")  # Drafts.source of copied drafts
    margin: float = 0.10
    min_rounds: int = 4
    ema: float = 0.3
    copy_enabled: bool = True
    copy_rounds: int = 0
    copy_tokens: float | None = None  # tokens emitted per copied-draft round (running mean)
    copy_seconds: float | None = None  # seconds per copied-draft round (draft + verify)
    _since_probe: int = 0
    _spec_rounds: int = 0

    @property
    def enabled(self) -> bool:
        """Any speculation left for this request."""
        return self.copy_enabled or self.model.enabled

    @property
    def spec_rounds(self) -> int:
        """Speculative rounds recorded in this request (any source)."""
        return self._spec_rounds

    @property
    def since_probe(self) -> int:
        """Speculative rounds since the last plain probe (or since the start)."""
        return self._since_probe

    def want_probe(self) -> bool:
        """True when the next step should be a plain verifier step measuring t_plain.

        t_plain decides something only once a source has `min_rounds` rounds to be judged
        on (switched off against plain), so the first probe waits until a judgment is one round
        away: a request whose copied drafts carry it in one or two rounds (an agent's call
        copying an earlier one) pays no plain forward. Then every `probe_every` rounds.
        Speed only: the modes that adapt K give the same tokens whatever runs (plain steps
        fuse like rounds)."""
        if not self.enabled or self._spec_rounds == 0:
            return False
        if self.model.t_plain is None:
            return self._judgment_near()
        return self._since_probe >= self.model.probe_every

    def _judgment_near(self) -> bool:
        """A source that is still on has one round left before it can be judged."""
        copy = self.copy_enabled and self.copy_rounds >= self.min_rounds - 1
        model = self.model.enabled and self.model.rounds >= self.model.min_rounds - 1
        return copy or model

    def budgets(self, k: int, copy: dict) -> dict:
        """Draft budgets per drafter name for the next round (0 = that source is off).

        `copy` holds the copied drafters' caps ({"suffix": n, "lookup": n})."""
        out = {name: (n if self.copy_enabled else 0) for name, n in copy.items()}
        out["model"] = k if self.model.enabled else 0
        return out

    def record_plain(self, seconds: float) -> None:
        self.model.record_plain(seconds)
        self._since_probe = 0
        self._judge_copy()

    def record_round(self, source: str, k: int, accepted: int, emitted: int, draft_s: float,
                     verify_s: float) -> None:
        self._spec_rounds += 1
        self._since_probe += 1
        if source in self.copy_names:
            self.copy_rounds += 1
            self.copy_tokens = running_mean(self.copy_tokens, float(emitted), self.ema)
            self.copy_seconds = running_mean(self.copy_seconds, draft_s + verify_s, self.ema)
        else:
            self.model.record_round(k, accepted, draft_s, verify_s)
        self._judge_copy()

    def copy_rate(self) -> float | None:
        if self.copy_tokens is None or not self.copy_seconds:
            return None
        return self.copy_tokens / self.copy_seconds

    def _judge_copy(self) -> None:
        rate = self.copy_rate()
        if rate is None or self.copy_rounds < self.min_rounds or not self.copy_enabled:
            return
        rivals = []
        if self.model.t_plain:
            rivals.append(1.0 / self.model.t_plain)
        if self.model.enabled and self.model.rounds >= self.model.min_rounds:
            rivals.append(self.model.rate(self.model.k))
        if rivals and rate < (1.0 - self.margin) * max(rivals):
            self.copy_enabled = False
