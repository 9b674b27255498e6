"""RequestPlan: what one request runs (drafters in order, copy delta, base pass, rules, K, escalation) and why.

`plan_request` decides everything about a request that does not change while it decodes, once,
from the mode, the SpecConfig, the sampling temperature and whether the two views differ. The
engine then prefills what the plan reads, the decode loop runs what it says, and each choice
carries a short reason (`RequestPlan.reasons`, one line per choice) for logs and tests.

The acceptance rule is resolved here into what the gate runs (`Acceptance`): the user's rule
name (`SpecConfig.rule_for`: "greedy", "cda", "exact", "coupled") becomes the gate's rule plus
whether the target rows are perturbed with the position's Gumbel noise ("coupled" is the gate's
greedy rule on perturbed rows) and whether the gate reads keyed uniforms ("exact" at T > 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from asymagent.spec_config import Mode, SpecConfig


@dataclass(frozen=True)
class Acceptance:
    """A round's acceptance rule as the gate runs it."""

    rule: str  # SpecConfig.rule_for's name: greedy | cda | exact | coupled
    gate: str  # the gate kernel's rule: greedy | cda | exact
    perturb: bool = False  # target rows + T * Gumbel noise of their positions (coupled)
    gate_noise: bool = False  # the gate reads keyed uniforms/exponentials (exact at T > 0)

    @classmethod
    def of(cls, rule: str, temperature: float) -> "Acceptance":
        sampled = temperature > 0.0
        if sampled and rule in ("coupled", "greedy"):
            return cls(rule=rule, gate="greedy", perturb=True)
        if rule == "coupled":  # T = 0: the argmax, i.e. the greedy rule
            return cls(rule=rule, gate="greedy")
        return cls(rule=rule, gate=rule, gate_noise=sampled and rule == "exact")


@dataclass(frozen=True)
class RequestPlan:
    """What one request runs, decided before prefill (see module docstring)."""

    mode: Mode
    spec: SpecConfig
    temperature: float
    verifier_role: str  # the cache the verifier reads: verifier_full | verifier_compressed
    drafters: tuple = ()  # drafter names in the order a round asks them: suffix | lookup, model
    suffix_store: bool = False  # suffix drafts may copy from the engine's earlier responses
    base_pass: bool = False  # the drafter on the compressed view (beta, cda's base row, JSD)
    # the drafter's full-view rows at the K+1 verify positions (asym): read by the base pass's
    # delta and JSD, and by cda; with neither (asym's defaults) the gate's target is the
    # verifier's rows and they are not computed
    drafter_rows: bool = False
    # the drafter's full-view prefill put off to the first round that asks the drafter model for
    # drafts (only its drafts read its cache: no rows, no base pass, a position-invariant rule,
    # so its bits cannot reach the output); a request whose rounds all copy their drafts pays none
    defer_drafter: bool = False
    copy_delta: bool = False  # decoding/copy_delta.py on the verifier's rows
    strict: Acceptance | None = None  # rule of the first `spec.strict_prefix` output positions
    acceptance: Acceptance | None = None  # rule of every later position
    adaptive_k: bool = False  # K (and the draft source) tuned from measurements
    escalation: bool = False  # the running JSD may switch to the full-context verifier
    plain_beta: float = 0.0  # beta of plain steps (asym fuses them like a round's tokens,
    # gated like them by spec.jsd_min: the loop passes it to Decoder.plain_step)
    reasons: dict = field(default_factory=dict)  # choice -> why, one short line each

    @property
    def speculative(self) -> bool:
        return bool(self.drafters)

    def acceptance_at(self, position: int) -> Acceptance:
        """The rule of a round whose first draft lands at output `position`."""
        if self.strict is not None and position < self.spec.strict_prefix:
            return self.strict
        return self.acceptance

    def describe(self) -> str:
        """One line per choice: `name: value (why)`."""
        values = {"verifier": self.verifier_role, "drafters": ",".join(self.drafters) or "none",
                  "base_pass": self.base_pass, "drafter_rows": self.drafter_rows,
                  "defer_drafter": self.defer_drafter,
                  "copy_delta": self.copy_delta,
                  "acceptance": None if self.acceptance is None else self.acceptance.rule,
                  "adaptive_k": self.adaptive_k, "escalation": self.escalation}
        return "\n".join(f"{k}: {v} ({self.reasons.get(k, '')})" for k, v in values.items())


def _drafters(spec: SpecConfig, mode: Mode, temperature: float, reasons: dict) -> tuple:
    """(drafter names in order, may suffix drafts read the shared store)."""
    if not spec.lookup_ngram:
        reasons["drafters"] = ("lookup_ngram=0: the drafter model only" if spec.draft_model else
                               "lookup_ngram=0 and draft_model=False: no drafts, plain steps")
        return (("model",) if spec.draft_model else ()), False
    if not spec.suffix:
        reasons["drafters"] = "suffix=False: prompt lookup" + (", then the drafter model" if spec.draft_model else "")
        return (("lookup", "model") if spec.draft_model else ("lookup",)), False
    # earlier responses only where drafts cannot change the output: with cda or exact at T > 0
    # the rounds' layout is part of the rule, and a store that other requests filled would make
    # the output depend on them (same seed, same output)
    store = spec.position_invariant(mode, temperature)
    reasons["drafters"] = "suffix drafts (full view" + (" + earlier responses" if store else
                                                        " only: the rule is not position-invariant") \
        + ("), then the drafter model" if spec.draft_model else "); draft_model=False: no drafter model")
    return (("suffix", "model") if spec.draft_model else ("suffix",)), store


def plan_request(mode: Mode, spec: SpecConfig, temperature: float, *, two_views: bool,
                 full_fits: bool = True, feature: bool = False) -> RequestPlan:
    """The plan of a request in `mode` (`two_views`: the compressed view differs from the full;
    `full_fits`: the full view is within the model's context limit, so the verifier could read
    it; in asym it may be longer, read only by the drafter and the copy structures; `feature`:
    the engine has a feature head, asked after the copied drafts, before the drafter model)."""
    reasons: dict = {}
    # A mode's verifier always reads the same cache: in an agent loop step 0 often has nothing to
    # compress (compressed == full), and switching caches at step 1 would re-prefill the whole
    # compressed view instead of only the appended messages.
    role = "verifier_compressed" if mode.compressed else "verifier_full"
    reasons["verifier"] = "the compressed view" if mode.compressed else "the full view"
    plain_beta = spec.beta if mode.fused and spec.fuse_bonus else 0.0
    if not mode.speculative:
        reasons["drafters"] = f"mode {mode.name}: the verifier alone"
        return RequestPlan(mode=mode, spec=spec, temperature=temperature, verifier_role=role,
                           reasons=reasons, plain_beta=plain_beta)
    drafters, store = _drafters(spec, mode, temperature, reasons)
    if feature:  # the feature head where no copy is found (decoding/feature_drafter.py)
        copies = tuple(d for d in drafters if d != "model")
        drafters = copies + ("feature",) + tuple(d for d in drafters if d == "model")
        reasons["drafters"] += "; the feature head where no copy is found"
    # the drafter on the compressed view serves delta-fusion (beta), cda's base row and
    # escalation's JSD; with none of them its prefill and per-round base pass are skipped
    needs_base = spec.beta > 0 or spec.acceptance == "cda" or spec.escalate_jsd is not None
    base = mode.fused and two_views and needs_base
    gated = f" (the delta gated at JSD >= {spec.jsd_min:g})" if spec.beta > 0 and spec.jsd_min else ""
    reasons["base_pass"] = (f"beta > 0{gated}, cda or escalate_jsd on two views" if base else
                            "not asym on two views" if not (mode.fused and two_views) else
                            "beta=0, no cda, no escalation: nothing reads it")
    rows = mode.fused and (base or spec.acceptance == "cda")
    reasons["drafter_rows"] = ("the base pass or cda reads them" if rows else
                               "not asym" if not mode.fused else
                               "no base pass, no cda: the gate's target is the verifier's rows")
    copy = mode.fused and two_views and spec.copy_weight > 0
    reasons["copy_delta"] = ("copy_weight > 0 on two views" if copy else
                             "copy_weight=0" if mode.fused and two_views else "not asym on two views")
    strict = None
    if mode.fused and spec.strict_prefix:
        strict = Acceptance.of(spec.rule_for(mode, 0, temperature), temperature)
    later = Acceptance.of(spec.rule_for(mode, spec.strict_prefix, temperature), temperature)
    reasons["acceptance"] = (f"{'acceptance' if mode.fused else 'spec_acceptance'}="
                             f"{spec.acceptance if mode.fused else spec.spec_acceptance} at T="
                             f"{temperature:g}: gate {later.gate}"
                             + (", Gumbel-perturbed rows" if later.perturb else ""))
    # Adaptive K reads wall-clock timings, so it only runs where K cannot change the output
    # (every token the target's argmax / Gumbel-max at its position); cda, exact at T > 0,
    # fuse_bonus=False and escalate_jsd decide per round and keep K fixed: same seed, same output.
    invariant = spec.position_invariant(mode, temperature)
    tune = spec.adaptive_k and invariant
    reasons["adaptive_k"] = ("adaptive_k=False" if not spec.adaptive_k else
                             "position-invariant rule" if invariant else
                             "the rule is not position-invariant: K stays fixed")
    defer = invariant and not (base or rows)
    reasons["defer_drafter"] = ("only the drafter model's drafts read its cache: prefilled at its "
                                "first round" if defer else
                                "its rows or base pass are read" if base or rows else
                                "the rule is not position-invariant: the drafter's bits could "
                                "reach the output")
    escalation = mode.fused and spec.escalate_jsd is not None and full_fits
    reasons["escalation"] = (f"escalate_jsd={spec.escalate_jsd}" if escalation else
                             "not asym" if not mode.fused else
                             "escalate_jsd=None" if spec.escalate_jsd is None else
                             "the full view is longer than the model's context: the verifier "
                             "cannot finish on it")
    return RequestPlan(mode=mode, spec=spec, temperature=temperature, verifier_role=role,
                       drafters=drafters, suffix_store=store, base_pass=base, drafter_rows=rows,
                       defer_drafter=defer, copy_delta=copy,
                       strict=strict, acceptance=later, adaptive_k=tune, escalation=escalation,
                       plain_beta=plain_beta, reasons=reasons)
