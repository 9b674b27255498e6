"""StepStats (one engine call) and RunStats (a whole agent run): the accounting contract.

Field names are a contract (docs/architecture.md §4); every field is JSON-serialisable.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields


@dataclass
class StepStats:
    """What one `engine.generate` / `engine.chat` call cost and how speculation went."""

    wall_s: float = 0.0  # whole call, prefill + decode
    ttft_s: float = 0.0  # call start -> first new token known
    prefill_s: float = 0.0  # time spent prefilling (all caches)
    decode_s: float = 0.0  # time spent in draft/verify rounds
    new_tokens: int = 0  # tokens emitted (including forced / jump-forward tokens)
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens accepted
    acceptance_by_position: list = field(default_factory=list)  # [i]: accepted / rounds reaching i
    mean_accepted_len: float = 0.0  # tokens emitted per verifier forward in spec rounds, in [1, K+1]
    verifier_prefill_tokens: int = 0  # tokens the verifier prefilled (after prefix reuse)
    drafter_prefill_tokens: int = 0  # tokens the drafter prefilled, full + base caches
    verifier_context_tokens: int = 0  # verifier's view length at the generation point
    full_context_tokens: int = 0  # full view length at the generation point
    compression_ratio: float = 1.0  # verifier_context_tokens / full_context_tokens
    escalated: bool = False  # finished by the verifier on the full context (escalate_jsd)
    verifier_flops: float = 0.0  # 2*N_non_emb*tokens + attention(context), summed over forwards
    # Extensions (not in the contract, useful for reports):
    mode: str = ""
    rounds: int = 0  # speculative rounds (verifier forwards while speculating)
    reached_by_position: list = field(default_factory=list)  # [i]: rounds whose gate reached draft i
    lookup_rounds: int = 0  # rounds whose drafts were copied (suffix matching or prompt lookup)
    # decode steps by what drafted them: {"suffix" | "lookup" | "model": rounds, "plain": plain
    # verifier steps}; jump-forward tokens are in forced_tokens (asymagent/decoding/adaptive_k.py
    # DraftChoice picks the source per step)
    draft_source: dict = field(default_factory=dict)
    # per draft source (issue 56): {"suffix" | "lookup" | "model" | "feature": {rounds, drafted,
    # accepted, emitted, mean_accepted_len, acceptance_by_position, reached_by_position,
    # accepted_by_position, draft_s}} over the speculative rounds that source drafted
    by_source: dict = field(default_factory=dict)
    k: int = 0  # K used (last round's, with adaptive_k)
    mean_jsd: float = 0.0  # mean JSD(p_aug || p_base) over verify positions (asym)
    forced_tokens: int = 0  # tokens the constraint alone determined (jump-forward; docs/engine.md)
    rewrites: int = 0  # compressed-view rewrites that forced a verifier re-prefill
    cached_tokens: int = 0  # verifier view tokens reused from its KV cache (not prefilled)
    recalls: int = 0  # removed text brought back into the verifier's view (CompressionConfig.max_recalls)
    recall_prefill_tokens: int = 0  # verifier tokens prefilled for recalls (also in verifier_prefill_tokens)
    recall_votes: int = 0  # the drafter's votes asked at a margin hesitation (CompressionConfig.recall_vote)
    recall_vetoes: int = 0  # ... of them that kept the step on the compressed view (no escalation)
    finish_reason: str = ""  # "stop" | "length" | "tool_calls" | "cancelled"

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict) -> "StepStats":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def pooled_by_source(steps: list) -> dict:
    """StepStats.by_source pooled over `steps`: counts summed, rates recomputed from them."""
    pooled: dict = {}
    for s in steps:
        for name, d in (getattr(s, "by_source", None) or {}).items():
            p = pooled.setdefault(name, {"rounds": 0, "drafted": 0, "accepted": 0, "emitted": 0,
                                         "draft_s": 0.0, "reached_by_position": [],
                                         "accepted_by_position": []})
            for key in ("rounds", "drafted", "accepted", "emitted", "draft_s"):
                p[key] += d.get(key, 0)
            for key in ("reached_by_position", "accepted_by_position"):
                for i, n in enumerate(d.get(key, [])):
                    while len(p[key]) <= i:
                        p[key].append(0)
                    p[key][i] += n
    for p in pooled.values():
        p["mean_accepted_len"] = p["emitted"] / p["rounds"] if p["rounds"] else 0.0
        p["acceptance_by_position"] = [a / r if r else 0.0 for a, r in
                                       zip(p["accepted_by_position"], p["reached_by_position"])]
    return pooled


_SUMMED = (
    "wall_s", "ttft_s", "prefill_s", "decode_s", "new_tokens", "drafted", "accepted",
    "verifier_prefill_tokens", "drafter_prefill_tokens", "verifier_flops", "rounds", "lookup_rounds",
    "forced_tokens", "rewrites", "recalls", "recall_prefill_tokens", "recall_votes", "recall_vetoes",
)


@dataclass
class RunStats:
    """A whole agent run: the per-step list plus totals, averages and the latency curve."""

    steps: list = field(default_factory=list)  # list[StepStats]

    def add(self, step: StepStats) -> None:
        self.steps.append(step)

    def totals(self) -> dict:
        out = {name: sum(getattr(s, name) for s in self.steps) for name in _SUMMED}
        out["steps"] = len(self.steps)
        out["escalations"] = sum(1 for s in self.steps if s.escalated)
        out["acceptance_rate"] = out["accepted"] / out["drafted"] if out["drafted"] else 0.0
        rounds = out["rounds"]
        spec_tokens = sum(s.mean_accepted_len * s.rounds for s in self.steps)
        out["mean_accepted_len"] = spec_tokens / rounds if rounds else 0.0
        full = sum(s.full_context_tokens for s in self.steps)
        ver = sum(s.verifier_context_tokens for s in self.steps)
        out["mean_compression_ratio"] = ver / full if full else 1.0
        out["per_token_s"] = out["wall_s"] / out["new_tokens"] if out["new_tokens"] else 0.0
        sources: dict = {}
        for s in self.steps:
            for name, count in (s.draft_source or {}).items():
                sources[name] = sources.get(name, 0) + count
        out["draft_source"] = sources
        out["by_source"] = pooled_by_source(self.steps)
        return out

    def acceptance_by_position(self) -> list:
        """Pooled over steps: accepted at position i / rounds reaching position i."""
        num: list = []
        den: list = []
        for s in self.steps:
            reached = s.reached_by_position  # [] in stats written before it existed
            for i, rate in enumerate(s.acceptance_by_position):
                r = reached[i] if reached else max(s.rounds, 1)
                while len(num) <= i:
                    num.append(0.0)
                    den.append(0.0)
                num[i] += rate * r
                den[i] += r
        return [n / d if d else 0.0 for n, d in zip(num, den)]

    def cumulative_latency(self) -> list:
        out, total = [], 0.0
        for s in self.steps:
            total += s.wall_s
            out.append(total)
        return out

    def to_dict(self) -> dict:
        return {
            "totals": self.totals(),
            "acceptance_by_position": self.acceptance_by_position(),
            "cumulative_latency_s": self.cumulative_latency(),
            "steps": [s.to_dict() for s in self.steps],
        }

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)
