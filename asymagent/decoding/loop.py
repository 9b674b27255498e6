"""The decode loop of one request: jump-forward, speculative rounds or plain steps, stops, escalation.

Each iteration emits tokens one of three ways: tokens the constraint alone determines
(jump-forward, no model forward), a speculative round (`Decoder.spec_round`), or a plain verifier
step (no drafter, K < 1, an adaptive-K probe, or speculation switched off). Which drafters a round
may use is measured per request (`DraftChoice`: copied drafts, the drafter model, plain). The new tokens are then
cut at EOS / a stop string, walked through the constraint, handed to the callback (streaming), and
the running JSD decides whether the verifier finishes on the full context (`escalate_jsd`); a
recall watch (`LoopContext.interrupt`, asymagent/context/recall.py) may stop the request early so
the chat layer decodes it again on a view with removed text restored.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from asymagent.decoding.adaptive_k import AdaptiveK, DraftChoice
from asymagent.decoding.constraint import advance_constraint
from asymagent.decoding.drafts import RoundOutcome
from asymagent.decoding.plan import RequestPlan
from asymagent.decoding.round import Decoder, RoundRule
from asymagent.decoding.stopping import StopChecker
from asymagent.decoding.tally import Tally
from asymagent.request import GenerationRequest
from asymagent.stats import StepStats


@dataclass
class LoopResult:
    finish: str  # stop | length | cancelled | recall (interrupted by LoopContext.interrupt)
    ttft_s: float | None  # call start -> first new token, None when nothing was emitted
    tally: Tally = field(default_factory=Tally)
    speculation_off: bool = False  # adaptive K switched the drafter model off during the request
    # index in the output of the last token a model chose (not forced by the constraint), -1 if
    # none: a one-token decode's verifier cache holds the prompt and the output before it
    last_free: int = -1


@dataclass
class LoopContext:
    """What the loop reads besides the decoder, the plan and the request."""

    # the verifier's View: it may grow up to `max_positions` (the drafter's full view may be
    # longer, in asym: the engine's ContextLengthError)
    bound: object
    max_positions: int  # the model's context limit (0: none)
    checker: StopChecker  # EOS ids and stop strings
    stats: StepStats  # forced_tokens and escalated are counted into it
    t_start: float  # call start (perf_counter), for ttft
    escalate: Callable[[], None] | None = None  # switch to the verifier on the full view
    # recall watch (asymagent/context/recall.py): interrupt(generated, start) -> True stops the
    # loop with finish "recall" (the caller restored removed text and decodes the step again)
    interrupt: Callable[[list, int], bool] | None = None


def decode_loop(decoder: Decoder, generated: list, plan: RequestPlan,
                request: GenerationRequest, ctx: LoopContext) -> LoopResult:
    """Extend `generated` (shared by every view of the request) until a stop or a limit.

    `plan` (asymagent/decoding/plan.py) says what runs: drafters, rules, adaptive K, escalation;
    `request` gives the token limit and the callback; the constraint is the decoder's.
    """
    spec, mode = plan.spec, plan.mode
    max_new_tokens, callback = request.max_new_tokens, request.callback
    constraint, stats = decoder.constraint, ctx.stats
    adaptive = AdaptiveK(k=spec.k, k_min=spec.k_min, k_max=spec.k_max)
    tune = plan.adaptive_k
    choice = DraftChoice(adaptive)  # copied drafts, the drafter model or plain, by measurement
    speculating = plan.speculative
    jsd_window: deque = deque(maxlen=spec.escalate_window)
    result = LoopResult(finish="length", ttft_s=None)
    while len(generated) < max_new_tokens:
        remaining = max_new_tokens - len(generated)
        left = (ctx.max_positions - len(ctx.bound)) if ctx.max_positions else remaining
        if left < 1:  # the context limit: no position left for another token
            break
        if constraint is not None and constraint.is_terminated():
            result.finish = "stop"  # a constraint that is already complete admits nothing more
            break
        # Jump-forward: tokens the constraint alone determines are emitted without a model
        # forward (the next forward feeds them as pending tokens), before the first round too.
        new = [] if constraint is None else \
            [int(t) for t in constraint.forced_tokens()[: min(remaining, left)]]
        jumped = bool(new)
        if not jumped:
            out = decode_step(decoder, plan, choice, speculating, (len(generated), remaining, left))
            if out.drafted and mode.fused:  # 0 drafted: a plain step ran
                jsd_window.append(out.jsd)
            result.tally.record(out)
            new = out.tokens
        start = len(generated)
        generated.extend(new)
        # Cut first (EOS kept, stop string cut), then advance the constraint through the kept
        # tokens only, up to its termination: it sees exactly the tokens that are emitted.
        keep = ctx.checker.first_stop(generated, start)
        if keep is not None:
            del generated[keep:]
            result.finish = "stop"
        if constraint is not None:
            kept, forced, free = advance_constraint(constraint, generated[start:], jumped)
            del generated[start + kept:]
            stats.forced_tokens += forced
            if free >= 0:
                result.last_free = start + free
        elif len(generated) > start:
            result.last_free = len(generated) - 1
        result.last_free = min(result.last_free, len(generated) - 1)  # a stop string cut it
        if ctx.interrupt is not None and len(generated) > start and ctx.interrupt(generated, start):
            result.finish = "recall"
            break
        if result.ttft_s is None and generated:
            result.ttft_s = time.perf_counter() - ctx.t_start
        if callback is not None and callback(generated[start:]) is False:
            result.finish = "cancelled"
            break
        if result.finish == "stop" or (constraint is not None and constraint.is_terminated()):
            result.finish = "stop"
            break
        if (plan.escalation and ctx.escalate is not None and not stats.escalated
                and len(jsd_window) == spec.escalate_window
                and sum(jsd_window) / len(jsd_window) > spec.escalate_jsd):
            stats.escalated, speculating = True, False
            ctx.escalate()
    # the drafter model was switched off (copied drafts compete on their own, DraftChoice)
    result.speculation_off = tune and not adaptive.enabled
    return result


def decode_step(decoder: Decoder, plan: RequestPlan, choice: DraftChoice, speculating: bool,
          where: tuple) -> RoundOutcome:
    """One model step: a speculative round or a plain verifier step. `where` is (tokens
    emitted so far, tokens still allowed, positions left in the context)."""
    spec, tune = plan.spec, plan.adaptive_k
    emitted, remaining, left = where
    k = min(choice.model.k if tune else spec.k, remaining - 1, left - 1)
    copy_k = min(spec.lookup_k, remaining - 1, left - 1)
    if decoder.max_drafts is not None:  # the rows a verify forward may have (round.py)
        k, copy_k = min(k, decoder.max_drafts), min(copy_k, decoder.max_drafts)
    share = decoder.draft_share() if tune and decoder.draft_share is not None else None
    if share is not None:  # in company: every request's verify fits one batched forward
        k, copy_k = min(k, share), min(copy_k, share)
    budgets = {"suffix": copy_k, "lookup": copy_k}
    budgets = choice.budgets(k, budgets) if tune else {**budgets, "model": k}
    budgets["feature"] = budgets["model"]  # the feature head drafts the model's K (plan.py)
    probe = tune and speculating and choice.want_probe()
    if not speculating or probe or max(budgets.values()) < 1:
        # asym fuses plain steps too (with the bonus row's beta), so a token never depends on
        # whether a round or a plain step emitted it (adaptive K, probes, the last token)
        out = decoder.plain_step(plan.plain_beta, spec.jsd_min)
        if probe:
            choice.record_plain(out.verify_s)
        return out
    out = decoder.spec_round(budgets, RoundRule(plan.acceptance_at(emitted), beta=spec.beta,
                                                gamma=spec.gamma, fuse_bonus=spec.fuse_bonus,
                                                jsd_min=spec.jsd_min))
    if out.drafted and tune:
        choice.record_round(out.source, out.drafted, out.accepted, len(out.tokens),
                            out.draft_s, out.verify_s)
    return out
