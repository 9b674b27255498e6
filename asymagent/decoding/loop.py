"""The decode loop of one request: jump-forward, speculative rounds or plain steps, stops, escalation.

Each iteration emits tokens one of three ways: tokens the constraint alone determines
(jump-forward, no model forward), a speculative round (`Decoder.spec_round`), or a plain verifier
step (no drafter, K < 1, an adaptive-K probe, or speculation switched off). Which drafters a round
may use is measured per request (`DraftChoice`: copied drafts, the drafter model, plain). The new tokens are then
cut at EOS / a stop string, walked through the constraint, handed to the callback (streaming), and
the running JSD decides whether the verifier finishes on the full context (`escalate_jsd`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from asymagent.decoding.adaptive_k import AdaptiveK, DraftChoice
from asymagent.decoding.constraint import advance_constraint
from asymagent.decoding.round import Decoder
from asymagent.decoding.stopping import StopChecker
from asymagent.decoding.tally import Tally
from asymagent.spec_config import Mode, SpecConfig
from asymagent.stats import StepStats


@dataclass
class LoopResult:
    finish: str  # stop | length | cancelled
    ttft_s: float | None  # call start -> first new token, None when nothing was emitted
    tally: Tally = field(default_factory=Tally)
    speculation_off: bool = False  # adaptive K switched the drafter model off during the request


def decode_loop(decoder: Decoder, generated: list, *, mode: Mode, spec: SpecConfig,
                max_new_tokens: int, temperature: float, views: tuple, max_positions: int,
                checker: StopChecker, stats: StepStats, t_start: float, constraint=None,
                callback=None, escalate: Callable[[], None] | None = None) -> LoopResult:
    """Extend `generated` (shared by every view of the request) until a stop or a limit.

    `views` are the request's Views; the longest may grow up to `max_positions` (0: no limit).
    `escalate()` switches the decoder to the verifier on the full view (mode asym).
    """
    adaptive = AdaptiveK(k=spec.k, k_min=spec.k_min, k_max=spec.k_max)
    # Adaptive K reads wall-clock timings, so it only runs where K cannot change the output
    # (every token the target's argmax / Gumbel-max at its position); cda, exact at T > 0,
    # fuse_bonus=False and escalate_jsd decide per round and keep K fixed: same seed, same output.
    tune = spec.adaptive_k and spec.position_invariant(mode, temperature)
    choice = DraftChoice(adaptive)  # copied drafts, the drafter model or plain, by measurement
    speculating = mode.speculative
    jsd_window: deque = deque(maxlen=spec.escalate_window)
    # asym fuses plain steps too (with the bonus row's beta), so a token never depends on
    # whether a round or a plain step emitted it (adaptive K, probes, the last token)
    plain_beta = spec.beta if mode.fused and spec.fuse_bonus else 0.0
    result = LoopResult(finish="length", ttft_s=None)
    while len(generated) < max_new_tokens:
        remaining = max_new_tokens - len(generated)
        longest = max(len(view) for view in views)
        left = (max_positions - longest) if max_positions else remaining
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
            k = min(adaptive.k if tune else spec.k, remaining - 1, left - 1)
            copy_k = min(spec.lookup_k, remaining - 1, left - 1)
            budgets = {"suffix": copy_k, "lookup": copy_k}
            budgets = choice.budgets(k, budgets) if tune else {**budgets, "model": k}
            probe = tune and speculating and choice.want_probe()
            if not speculating or probe or max(budgets.values()) < 1:
                out = decoder.plain_step(plain_beta)
                if probe:
                    choice.record_plain(out.verify_s)
            else:
                out = decoder.spec_round(budgets, rule=spec.rule_for(mode, len(generated), temperature),
                                         beta=spec.beta, gamma=spec.gamma, fuse_bonus=spec.fuse_bonus)
                if out.drafted:  # 0: the constraint left nothing to draft, a plain step ran
                    if tune:
                        choice.record_round(out.source, out.drafted, out.accepted, len(out.tokens),
                                            out.draft_s, out.verify_s)
                    if mode.fused:
                        jsd_window.append(out.jsd)
            result.tally.record(out)
            new = out.tokens
        start = len(generated)
        generated.extend(new)
        # Cut first (EOS kept, stop string cut), then advance the constraint through the kept
        # tokens only, up to its termination: it sees exactly the tokens that are emitted.
        keep = checker.first_stop(generated, start)
        if keep is not None:
            del generated[keep:]
            result.finish = "stop"
        if constraint is not None:
            kept, forced = advance_constraint(constraint, generated[start:], jumped)
            del generated[start + kept:]
            stats.forced_tokens += forced
        if result.ttft_s is None and generated:
            result.ttft_s = time.perf_counter() - t_start
        if callback is not None and callback(generated[start:]) is False:
            result.finish = "cancelled"
            break
        if result.finish == "stop" or (constraint is not None and constraint.is_terminated()):
            result.finish = "stop"
            break
        if (mode.fused and spec.escalate_jsd is not None and escalate is not None
                and not stats.escalated and len(jsd_window) == spec.escalate_window
                and sum(jsd_window) / len(jsd_window) > spec.escalate_jsd):
            stats.escalated, speculating = True, False
            escalate()
    # the drafter model was switched off (copied drafts compete on their own, DraftChoice)
    result.speculation_off = tune and not adaptive.enabled
    return result
