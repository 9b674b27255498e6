"""One speculative round (gpt-fast style): draft K, verify K+1 in one forward, base pass, gate, crop.

Glossary (one round, K drafts, vLLM's words): *draft tokens* d_1..d_K continue the full view
(copied from it by the LookupDrafter, or proposed by the ModelDrafter); the verifier scores K+1
positions in ONE forward; the gate accepts a prefix of n drafts (*accepted tokens*) and emits
one more token at position n+1 (*recovered* token on a reject, *bonus* token when all K pass).
A round therefore emits n+1 tokens per verifier forward.

Views and caches (asymagent/kv/cache.py has the invariant): the verifier reads its view (the
compressed one in modes asym/compressed), the drafter reads the full view, the base pass reads
the compressed view with the drafter. Every forward first feeds the cache's pending tokens (the
last committed token, plus anything a constraint forced), so after a round each cache is
simply cropped back to the committed tokens it holds.

The gate itself (delta-fusion, JSD, cda/exact/greedy) is `asymagent.kernels.fused_gate`; this
file prepares its rows and applies its verdict. The "coupled" rule is the gate's greedy rule on
rows perturbed with the Gumbel noise of their output positions (docs/engine.md, "Sampling").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asymagent.decoding.drafts import Drafts, RoundOutcome
from asymagent.decoding.flops import FlopCounter
from asymagent.decoding.logit_processors import LogitProcessors
from asymagent.decoding.logprobs import LogprobRecorder
from asymagent.decoding.model_drafter import DraftHead
from asymagent.decoding.noise import KeyedNoise
from asymagent.decoding.plan import Acceptance
from asymagent.decoding.sampling import NEG_INF, mask_rows, perturb, sample_token, top_p_filter
from asymagent.kernels import fused_gate
from asymagent.kv.attention import GROUP_ROWS
from asymagent.kv.cache import ViewCache
from asymagent.request import SamplingParams
from asymagent.scheduling import company_clock


# On the CPU a verify forward scores a position with the bits a one-token forward gives only up
# to GROUP_ROWS (32) rows (grouped attention rows, asymagent/kv/attention.py; measured on the
# embedded verifier in bf16: 32 rows identical, 33 rows differ by up to 0.6 in a logit), so a
# round verifies at most 31 drafts there, whatever lookup_k or k_max ask: the modes keep saying
# the same token (spec lossless against full) at any setting.
CPU_MAX_DRAFTS = GROUP_ROWS - 1


@dataclass
class Drafting:
    """What a speculative request drafts with: the drafters in the order a round asks them
    (copied continuations first, then the drafter model), the drafter model's cache on the full
    view, its cache on the compressed view (`base`, None when the plan skips the base pass) and
    its head; `fused` (mode asym) fuses in the gate; `rows` (RequestPlan.drafter_rows) computes
    the drafter's full-view rows at the verify positions for it (False: nothing reads them)."""

    drafters: list
    drafter: ViewCache
    base: ViewCache | None = None
    head: DraftHead | None = None
    fused: bool = False
    rows: bool = True


@dataclass(frozen=True)
class RoundRule:
    """How a round's gate decides: the resolved acceptance rule, beta, gamma, fuse_bonus and the
    divergence gate's jsd_min (the delta only where JSD >= jsd_min; SpecConfig.jsd_min)."""

    acceptance: Acceptance
    beta: float = 0.0
    gamma: float = 1.0
    fuse_bonus: bool = True
    jsd_min: float = 0.0


class Decoder:
    """The decode steps of one request: plain verifier steps and speculative rounds.

    `verifier` reads the verifier's view; `sampling` (asymagent/request.py) says how a token is
    chosen: temperature and top_p here, penalties, logit bias, top-k and min-p through
    `LogitProcessors` on the verifier's rows. `drafting` (None: no speculation) holds the
    drafters and the drafter model's caches. `logprobs` records the verifier's raw row of every
    emitted token (asymagent/decoding/logprobs.py). `noise` (asymagent/decoding/noise.py) keys
    every random number by output position; it is only read at temperature > 0.
    """

    def __init__(self, verifier: ViewCache, flops: FlopCounter, sampling: SamplingParams, *,
                 noise: KeyedNoise | None = None, constraint=None,
                 drafting: Drafting | None = None, copy=None,
                 logprobs: LogprobRecorder | None = None) -> None:
        self.verifier, self.flops = verifier, flops
        self.temperature, self.top_p, self.noise = sampling.temperature, sampling.top_p, noise
        self.constraint = constraint
        d = drafting if drafting is not None else Drafting(drafters=[], drafter=None)
        self.drafters = tuple(d.drafters)  # asked in order each round; the first proposal wins
        self.drafter, self.base, self.head, self.fused = d.drafter, d.base, d.head, d.fused
        self.rows = d.fused and d.rows  # the drafter's rows reach the gate (see Drafting)
        self.verifier_flops = 0.0  # prefill + every verifier forward of the request
        # asymagent/decoding/copy_delta.py CopyDelta (asym on two views): what only the full
        # view's removed text could be copied from, added to the verifier's rows; None: off
        self.copy = copy
        self.verifier_tokens_fed = 0
        self.processors = LogitProcessors.of(sampling, prompt_ids=verifier.view.prompt)
        self.logprobs = logprobs
        # most drafts a round may verify (None: no cap); the engine sets CPU_MAX_DRAFTS on the CPU
        self.max_drafts: int | None = None
        # () -> most drafts a round may verify in company, or None (the continuous-batching
        # batcher's fair share of a forward's rows, asymagent/scheduling/batcher.py); read only
        # where K is tuned (a position-invariant rule: tokens do not depend on K)
        self.draft_share = None
        # rounds as static-shape device calls on static caches (CUDA graphs), else None
        from asymagent.decoding.graph_round import graph_round_for

        self.graph_round = graph_round_for(self)

    def position(self) -> int:
        """Output position of the next token (new tokens emitted so far): the noise key."""
        return len(self.verifier.view.generated)

    def _verify(self, tokens: list, keep: int) -> torch.Tensor:
        """Feed the verifier's pending tokens + `tokens`; logits of the last `keep` rows [keep, V].

        Recording log-probs, the rows of pending tokens nobody scored yet (jump-forward tokens)
        are kept too and recorded: the forward computes them anyway."""
        pending = self.verifier.pending()
        fed = len(pending) + len(tokens)
        self.verifier_flops += self.flops.forward(fed, len(self.verifier.cache))
        self.verifier_tokens_fed += fed
        if self.logprobs is None:
            return self.verifier.logits(tokens, keep)
        generated = self.verifier.view.generated
        unscored = max(len(generated) - self.logprobs.scored, 0)
        if unscored > len(pending) - 1:
            raise RuntimeError(f"{unscored} emitted tokens have no verifier row left to score them")
        rows = self.verifier.logits(tokens, keep + unscored)  # [unscored + keep, V]
        self.logprobs.record(rows[:unscored], generated[len(generated) - unscored:])
        return rows[unscored:]

    def _target(self, rows: torch.Tensor, drafts: list, masks) -> torch.Tensor:
        """The verifier's rows [R, V] as the gate's target: the copy delta (joining the target like
        delta-fusion does), penalties and logit bias, the constraint masks, then the nucleus /
        top-k / min-p of softmax(rows / T)."""
        if self.copy is not None:
            rows = rows + self.copy.rows(drafts, rows)  # [R, V]
        rows = self.processors.penalise(rows, self.verifier.view.generated, drafts)
        rows = top_p_filter(mask_rows(rows, masks), self.temperature, self.top_p)
        return self.processors.truncate(rows, self.temperature)

    def score_pending(self) -> None:
        """Record log-probs of emitted tokens no forward scored yet (jump-forward tokens at the
        end of a response, or before an escalation): one more verifier forward."""
        if self.logprobs is None:
            return
        view = self.verifier.view
        unscored = len(view.generated) - self.logprobs.scored
        if unscored <= 0:
            return
        cache = self.verifier.cache
        cache.crop(min(len(cache), len(view) - 1 - unscored))  # their rows must be recomputed
        self._verify([], keep=1)

    def plain_step(self, beta: float = 0.0, jsd_min: float = 0.0) -> RoundOutcome:
        """One verifier forward, one token (modes full/compressed, escalation, speculation off).

        In asym on two views with `beta` > 0 the token is fused like every round's token (a
        round with no drafts, the same divergence gate `jsd_min`): the output never depends on
        which positions plain steps took.
        """
        if self.fused and self.base is not None and beta > 0.0:
            return self._round(Drafts(tokens=[], source=""), None,
                               RoundRule(Acceptance.of("greedy", self.temperature), beta=beta,
                                         gamma=1.0, fuse_bonus=True, jsd_min=jsd_min))
        t0 = company_clock.now()  # wall time, or the cost in company (only K and drafters read it)
        raw = self._verify([], keep=1)  # [1, V]
        c = self.constraint
        logits = self._target(raw, [], None if c is None else [c.allowed_mask()])[0]  # [V]
        gumbel = self.noise.gumbel(self.position()) if self.temperature > 0.0 else None
        token = sample_token(logits, self.temperature, gumbel)
        if self.logprobs is not None:
            self.logprobs.record(raw, [token])
        return RoundOutcome(tokens=[token], verify_s=company_clock.now() - t0)

    def _proposal(self, drafts: Drafts, like: torch.Tensor) -> torch.Tensor:
        """[K, V] logits the drafts were drawn from: one-hot (log 1 = 0 at d_i) or the drafter's."""
        k = len(drafts)
        if drafts.proposal is None:
            one_hot = torch.full((k, like.shape[-1]), NEG_INF, device=like.device)  # [K, V]
            one_hot[torch.arange(k, device=like.device), torch.tensor(drafts.tokens, device=like.device, dtype=torch.long)] = 0.0
            return one_hot
        full = self.head.to_full(drafts.proposal).to(like.device)  # [K, V]
        return full if drafts.masks is None else mask_rows(full, drafts.masks[:k])

    def spec_round(self, budgets: dict, rule: "RoundRule") -> RoundOutcome:
        """Draft -> verify K+1 in one forward -> base pass -> gate -> crop.

        `budgets[name]` is how many drafts to ask the drafter called `name` for ("suffix",
        "lookup", "model"); the first non-empty proposal wins. `rule`: the round's acceptance
        as the plan resolved it (asymagent/decoding/plan.py) and the gate's beta and gamma.
        """
        if self.graph_round is not None:  # the whole round on the device (graph_round.py)
            outcome = self.graph_round.spec_round(budgets, rule)
            if outcome is not None:
                return outcome
        # 1. Draft d_1..d_K on the full view: the first drafter with a proposal wins.
        t0 = company_clock.now()  # wall time, or the cost in company (company_clock.py)
        drafts, source = Drafts(tokens=[], source=""), None
        for source in self.drafters:
            drafts = source.propose(budgets.get(source.name, 0))
            if drafts:
                break
        if not drafts:  # nothing to propose (e.g. the constraint allows no draft): plain step
            return self.plain_step(rule.beta if rule.fuse_bonus else 0.0, rule.jsd_min)
        outcome = self._round(drafts, t0, rule)
        source.update(outcome)
        return outcome

    def _round(self, drafts: Drafts, t0: float | None, rule: "RoundRule") -> RoundOutcome:
        """Steps 2-5 of a round over `drafts` (none: a fused plain step); `t0` = drafting start."""
        t1 = company_clock.now()
        t0 = t1 if t0 is None else t0
        k, tokens = len(drafts), drafts.tokens
        masks = drafts.masks
        if masks is None and self.constraint is not None and not k:
            masks = [self.constraint.allowed_mask()]  # a fused plain step reads the mask itself
        position = self.position()  # output position of d_1 (row 0)
        ha = None  # [K+1, H] the drafter's full-view ("augmented") hidden states
        if self.rows:
            ha = drafts.hidden if drafts.hidden is not None else self.drafter.hidden(tokens, k + 1)

        # 2. Verify: the verifier scores K+1 positions in ONE forward on its (compressed) view.
        raw = self._verify(tokens, keep=k + 1)  # [K+1, V]
        v = self._target(raw, tokens, masks)  # [K+1, V]
        proposal = self._proposal(drafts, v)  # [K, V]

        # 3. Base pass: the drafter on the compressed view scores the same K tokens (O(K)).
        a = b = None  # [K+1, V] drafter rows on the full / compressed view (asym only)
        if self.rows and self.base is not None:
            hb = self.base.hidden(tokens, k + 1)  # [K+1, H]
            # one head pass for both views: on CPU the [V, H] head read dominates a few-row
            # matmul, so 2(K+1) rows cost about what K+1 rows do
            ab = self.head.full_logits(torch.cat([ha, hb])).to(v.device)  # [2(K+1), V]
            a, b = mask_rows(ab[: k + 1], masks), mask_rows(ab[k + 1:], masks)
        elif self.rows:  # one view: the base pass would reproduce the drafter (b = a, delta 0)
            a = mask_rows(self.head.full_logits(ha).to(v.device), masks)

        # 4. Gate: delta-fusion and the acceptance rule -> n accepted drafts + the next token.
        # Mode spec passes no drafter rows: the target is the verifier (beta 0, lossless rules).
        # Sampling (T > 0): "coupled" perturbs the target rows with the Gumbel noise of their
        # positions and runs the gate's greedy rule, so every emitted token is the Gumbel-max
        # of the (fused) target at its position; "exact" gets its uniforms and exponentials
        # keyed by position too. Greedy and cda read no noise.
        noise = None
        acc = rule.acceptance
        if acc.perturb:
            v = perturb(v, self.temperature, self.noise.gumbel_rows(position, k + 1))  # [K+1, V]
        elif acc.gate_noise:
            noise = self.noise.gate_noise(position, k)
        result = fused_gate(v[None], None if a is None else a[None], None if b is None else b[None],
                            torch.tensor([tokens], dtype=torch.long, device=v.device).view(1, k),  # [1, K]
                            beta=rule.beta if self.fused else 0.0,
                            gamma=rule.gamma if self.fused else 1.0,
                            acceptance=acc.gate, temperature=self.temperature, noise=noise,
                            proposal_logits=proposal[None], fuse_bonus=rule.fuse_bonus,
                            jsd_min=rule.jsd_min if self.fused else 0.0)
        n = int(result.num_accepted[0])  # the one sync per round
        token = int(result.next_token[0])

        # 5. Crop every cache to the committed tokens it holds (old view + accepted drafts).
        for reader in (self.verifier, self.drafter, self.base):
            if reader is not None:
                reader.commit(n)
        if self.logprobs is not None:
            self.logprobs.record(raw[: n + 1], tokens[:n] + [token])
        return RoundOutcome(tokens=tokens[:n] + [token], drafted=k, accepted=n,
                            jsd=float(result.jsd[0, : n + 1].mean()) if self.fused else 0.0,
                            draft_s=t1 - t0 - drafts.setup_s, verify_s=company_clock.now() - t1,
                            source=drafts.source)

    def escalate(self, verifier: ViewCache) -> None:
        """Finish the response with `verifier` (the verifier on the full context): plain steps only."""
        self.score_pending()  # tokens the old verifier would have scored at its next forward
        self.verifier, self.fused, self.rows, self.copy = verifier, False, False, None
