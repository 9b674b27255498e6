"""Speculation accounting of one request (vLLM's definitions, see asymagent/stats.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from asymagent.decoding.drafts import RoundOutcome
from asymagent.stats import StepStats


@dataclass
class Tally:
    """Counts over the speculative rounds of one call; `fill` writes them into StepStats."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0  # tokens emitted by speculative rounds (accepted + recovered/bonus)
    last_k: int = 0
    jsd_sum: float = 0.0
    lookup_rounds: int = 0
    sources: dict = field(default_factory=dict)  # Drafts.source of each round, "plain" for plain steps
    reached: list = field(default_factory=list)  # [i]: rounds that reached draft position i
    accepted_at: list = field(default_factory=list)  # [i]: rounds that accepted position i
    by_source: dict = field(default_factory=dict)  # Drafts.source -> SourceTally (issue 56)

    def record(self, out: RoundOutcome) -> None:
        """One decode step: a speculative round (out.drafted > 0) or a plain step."""
        source = out.source if out.drafted else "plain"
        self.sources[source] = self.sources.get(source, 0) + 1
        if not out.drafted:
            return
        self.rounds += 1
        self.drafted += out.drafted
        self.accepted += out.accepted
        self.emitted += len(out.tokens)
        self.last_k = out.drafted
        self.lookup_rounds += int(out.lookup)
        self.jsd_sum += out.jsd
        _positions(self.reached, self.accepted_at, out)
        self.by_source.setdefault(out.source, SourceTally()).record(out)

    def fill(self, stats: StepStats, fused: bool) -> None:
        stats.rounds, stats.drafted, stats.accepted = self.rounds, self.drafted, self.accepted
        stats.lookup_rounds = self.lookup_rounds
        stats.draft_source = dict(self.sources)
        stats.k = self.last_k
        stats.acceptance_by_position = [a / r for a, r in zip(self.accepted_at, self.reached)]
        stats.reached_by_position = list(self.reached)
        stats.mean_accepted_len = self.emitted / self.rounds if self.rounds else 0.0
        stats.mean_jsd = self.jsd_sum / self.rounds if fused and self.rounds else 0.0
        stats.by_source = {name: t.to_dict() for name, t in sorted(self.by_source.items())}


def _positions(reached: list, accepted_at: list, out: RoundOutcome) -> None:
    """Count the draft positions the gate looked at in one round, and which it accepted."""
    for i in range(min(out.accepted + 1, out.drafted)):
        if i == len(reached):
            reached.append(0)
            accepted_at.append(0)
        reached[i] += 1
        accepted_at[i] += int(i < out.accepted)


@dataclass
class SourceTally:
    """The rounds of one draft source (suffix, lookup, model, feature): StepStats.by_source."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    draft_s: float = 0.0
    reached: list = field(default_factory=list)
    accepted_at: list = field(default_factory=list)

    def record(self, out: RoundOutcome) -> None:
        self.rounds += 1
        self.drafted += out.drafted
        self.accepted += out.accepted
        self.emitted += len(out.tokens)
        self.draft_s += out.draft_s
        _positions(self.reached, self.accepted_at, out)

    def to_dict(self) -> dict:
        """vLLM's words per source: mean accepted length (tokens per verifier forward), counts
        and acceptance per draft position, seconds spent drafting."""
        return {"rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
                "emitted": self.emitted,
                "mean_accepted_len": self.emitted / self.rounds if self.rounds else 0.0,
                "acceptance_by_position": [a / r for a, r in zip(self.accepted_at, self.reached)],
                "reached_by_position": list(self.reached),
                "accepted_by_position": list(self.accepted_at), "draft_s": self.draft_s}
