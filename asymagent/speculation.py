"""The draft-verify round loop (gpt-fast style): draft K, verify K+1 in one forward, gate, crop.

Glossary (one round, K drafts, vLLM's words): *draft tokens* d_1..d_K come from the drafter on
the full view; the verifier scores K+1 positions in ONE forward; the gate accepts a prefix of
n drafts (*accepted tokens*) and emits one more token at position n+1 (*recovered* token on a
reject, *bonus* token when all K pass). A round therefore emits n+1 tokens per verifier forward.

Views and caches (asymagent/cache.py has the invariant): the verifier reads `view_v` (the
compressed view in mode asym/compressed), the drafter reads `view_d` (the full view), the base
pass reads `view_b` (drafter on the compressed view). Every forward first feeds the cache's
pending tokens (the last committed token, plus anything a constraint forced), so after a round
each cache is simply cropped back to the committed tokens it holds.

The gate itself (delta-fusion, JSD, cda/exact/greedy) is `asymagent.kernels.fused_gate`; this
file only prepares its rows and applies its verdict.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from asymagent.cache import ModelCache, View
from asymagent.flops import FlopCounter
from asymagent.kernels import fused_gate

NEG_INF = float("-inf")


# --------------------------------------------------------------------------- sampling helpers
def top_p_filter(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Set logits outside the nucleus of softmax(logits / T) to -inf. [..., V] -> [..., V]."""
    if top_p >= 1.0 or temperature <= 0.0:
        return logits
    probs = torch.softmax(logits / temperature, dim=-1)  # [..., V]
    sorted_p, order = probs.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each token in sorted order
    drop_sorted = before >= top_p  # keep the smallest prefix whose mass reaches top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, NEG_INF)


def sample_token(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """Greedy at temperature 0 (first index on ties), else a sample of softmax(logits / T). [V]."""
    if temperature <= 0.0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # [V]
    return int(torch.multinomial(probs, 1, generator=generator))


def apply_mask(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """logits [..., V] with disallowed tokens at -inf; `mask` [V'] bool is padded/cut to V."""
    if mask is None:
        return logits
    v = logits.shape[-1]
    mask = mask.to(device=logits.device, dtype=torch.bool)
    if mask.numel() < v:
        mask = torch.cat([mask, mask.new_zeros(v - mask.numel())])
    return logits.masked_fill(~mask[:v], NEG_INF)


# --------------------------------------------------------------------------- drafter head
class DraftHead:
    """The drafter's output head: reduced draft vocabulary for proposing, full head for the gate.

    `draft_vocab` (LongTensor [N], ids into the full vocabulary) selects the head rows used
    while drafting (the head dominates a small drafter's cost: 49k rows for SmolLM2); the K+1
    verify positions use every row, since delta and JSD are defined on the full vocabulary.
    """

    def __init__(self, drafter: torch.nn.Module, draft_vocab: torch.Tensor | None) -> None:
        head = drafter.get_output_embeddings()
        self.weight = head.weight  # [V, H]
        self.bias = getattr(head, "bias", None)  # [V] or None
        self.vocab_size = int(self.weight.shape[0])
        self.vocab = None if draft_vocab is None else draft_vocab.to(self.weight.device).long()
        if self.vocab is None:
            self.draft_weight, self.draft_bias = self.weight, self.bias
        else:
            self.draft_weight = self.weight[self.vocab].contiguous()  # [N, H]
            self.draft_bias = None if self.bias is None else self.bias[self.vocab]

    @torch.inference_mode()
    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[H] -> [N] logits over the draft vocabulary (N = V without a reduced vocabulary)."""
        return torch.nn.functional.linear(hidden, self.draft_weight, self.draft_bias).float()

    @torch.inference_mode()
    def full_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[R, H] -> [R, V] logits over the full vocabulary."""
        return torch.nn.functional.linear(hidden, self.weight, self.bias).float()

    def token_id(self, index: int) -> int:
        return index if self.vocab is None else int(self.vocab[index])

    def to_full(self, rows: torch.Tensor) -> torch.Tensor:
        """[R, N] draft-vocabulary logits -> [R, V] with -inf outside the draft vocabulary."""
        if self.vocab is None:
            return rows
        out = rows.new_full((rows.shape[0], self.vocab_size), NEG_INF)
        return out.index_copy_(1, self.vocab.to(rows.device), rows)


@dataclass
class RoundOutcome:
    """What one decode step did: tokens it emitted and, for a speculative round, its gate verdict."""

    tokens: list  # list[int]: accepted drafts + recovered/bonus token (or the one plain token)
    drafted: int = 0  # K actually drafted (0 for a plain step)
    accepted: int = 0  # n, drafts accepted
    jsd: float = 0.0  # mean JSD(p_aug || p_base) over the positions the gate used
    draft_s: float = 0.0  # time drafting (drafter forwards + sampling)
    verify_s: float = 0.0  # time verifying (verifier + base forwards + gate)
    lookup: bool = False  # the drafts came from prompt lookup, not the drafter


@dataclass
class Speculator:
    """Decode steps for one request over up to three caches (see the module docstring)."""

    verifier: ModelCache
    view_v: View
    flops: FlopCounter
    temperature: float = 0.0
    top_p: float = 1.0
    generator: torch.Generator | None = None
    constraint: object = None
    drafter: ModelCache | None = None
    view_d: View | None = None
    base: ModelCache | None = None  # None: the base view equals the drafter's view (b = a)
    view_b: View | None = None
    head: DraftHead | None = None
    verifier_flops: float = 0.0
    verifier_tokens_fed: int = 0
    lookup_ngram: int = 0  # >0: try prompt-lookup drafts before the drafter (prompt_lookup.py)

    # ----------------------------------------------------------------- verifier forward
    def _verify(self, drafts: list, keep: int) -> torch.Tensor:
        """Feed the verifier's pending tokens + drafts; logits of the last `keep` rows [keep, V]."""
        ids = self.verifier.pending(self.view_v) + drafts
        self.verifier_flops += self.flops.forward(len(ids), len(self.verifier))
        self.verifier_tokens_fed += len(ids)
        return self.verifier.forward_logits(ids, keep)

    def _mask(self) -> torch.Tensor | None:
        return None if self.constraint is None else self.constraint.allowed_mask()

    # ----------------------------------------------------------------- plain verifier step
    def plain_step(self) -> RoundOutcome:
        """One verifier forward, one token (modes full/compressed, escalation, speculation off)."""
        t0 = time.perf_counter()
        logits = self._verify([], keep=1)[0]  # [V]
        logits = apply_mask(logits, self._mask())
        logits = top_p_filter(logits, self.temperature, self.top_p)
        token = sample_token(logits, self.temperature, self.generator)
        return RoundOutcome(tokens=[token], verify_s=time.perf_counter() - t0)

    # ----------------------------------------------------------------- speculative round
    def _lookup_drafts(self, k: int) -> tuple[list, list]:
        """Prompt-lookup drafts on the full view (constraint advanced through them): (drafts, masks)."""
        from asymagent.prompt_lookup import lookup_continuation

        found = lookup_continuation(self.view_d.ids(), self.lookup_ngram, k)
        c = self.constraint
        if c is None:
            return found, [None] * len(found)
        drafts, masks = [], []
        for token in found:
            mask = c.allowed_mask()  # [V'] bool
            if token >= mask.numel() or not bool(mask[token]) or not c.advance(token):
                break
            drafts.append(token)
            masks.append(mask)
            if c.is_terminated():
                break
        return drafts, masks

    def spec_round(self, k: int, *, asym: bool, acceptance: str, beta: float, gamma: float,
                   fuse_bonus: bool, lookup_k: int = 0) -> RoundOutcome:
        """Draft k tokens, verify k+1 positions in one forward, gate, crop every cache.

        With `lookup_ngram` set and `lookup_k` > 0, prompt-lookup drafts (up to lookup_k) are
        tried first; the drafter proposes only when the full view has no matching n-gram.
        """
        t0 = time.perf_counter()
        c = self.constraint
        drafts: list = []
        masks: list = []  # constraint masks at positions 1..K+1
        if self.lookup_ngram and lookup_k > 0:
            drafts, masks = self._lookup_drafts(lookup_k)
        if drafts:
            self._close_masks(masks, len(drafts))
            return self._verify_round(drafts, masks, None, None, t0, asym=asym, acceptance=acceptance,
                                      beta=beta, gamma=gamma, fuse_bonus=fuse_bonus)
        # 1. Draft d_1..d_K incrementally on the drafter's full-view cache.
        proposal_rows: list = []  # [N] logits each draft was sampled from
        hiddens: list = []  # [H] drafter hidden state at positions 1..K(+1)
        feed = self.drafter.pending(self.view_d)
        for _ in range(k):
            hidden = self.drafter.forward_hidden(feed)[-1]  # [H]
            logits = self.head.draft_logits(hidden)  # [N]
            mask = None
            if c is not None:
                mask = c.allowed_mask()  # [V] bool
                small = mask if self.head.vocab is None else _gather_mask(mask, self.head.vocab)
                logits = apply_mask(logits, small)
                if not torch.isfinite(logits).any():  # nothing allowed inside the draft vocab
                    break
            token = self.head.token_id(sample_token(logits, self.temperature, self.generator))
            if c is not None and not c.advance(token):
                break
            hiddens.append(hidden)
            drafts.append(token)
            proposal_rows.append(logits)
            masks.append(mask)
            if c is not None and c.is_terminated():
                break
            feed = [token]
        k = len(drafts)
        self._close_masks(masks, k)
        if k == 0:  # the constraint left nothing to draft: undo and take a plain step
            self.drafter.crop(len(self.view_d) - 1)
            return self.plain_step()
        if asym:  # the K+1-th drafter row (fusion / JSD at the bonus position)
            hiddens.append(self.drafter.forward_hidden([drafts[-1]])[-1])
        return self._verify_round(drafts, masks, proposal_rows, hiddens, t0, asym=asym,
                                  acceptance=acceptance, beta=beta, gamma=gamma, fuse_bonus=fuse_bonus)

    def _close_masks(self, masks: list, k: int) -> None:
        """Add the K+1-th constraint mask and roll the constraint back over the k drafts."""
        c = self.constraint
        if c is not None:
            # once the drafts complete the constraint, whatever the gate emits after them is
            # dropped by the engine, so that row is left unrestricted
            masks.append(None if c.is_terminated() else c.allowed_mask())
            c.rollback(k)

    def _verify_round(self, drafts: list, masks: list, proposal_rows: list | None,
                      hiddens: list | None, t0: float, *, asym: bool, acceptance: str, beta: float,
                      gamma: float, fuse_bonus: bool) -> RoundOutcome:
        """Steps 2-4 of a round for drafts d_1..d_K (constraint rolled back, K+1 masks).

        `proposal_rows`/`hiddens` come from the drafter; None means prompt-lookup drafts: the
        proposal is one-hot on each draft and, in asym, the drafter scores all K drafts on its
        full view in ONE forward (their rows are what it would have drafted from).
        """
        k = len(drafts)
        c = self.constraint
        lookup = proposal_rows is None
        if asym and lookup:
            feed = self.drafter.pending(self.view_d) + drafts
            hiddens = list(self.drafter.forward_hidden(feed)[-(k + 1):])  # K+1 x [H]
        t1 = time.perf_counter()

        # 2. Verifier scores K+1 positions in one forward on its (compressed) view.
        v = self._verify(drafts, keep=k + 1)  # [K+1, V]
        device = v.device
        if c is not None:
            v = _mask_rows(v, masks)
        v = top_p_filter(v, self.temperature, self.top_p)  # nucleus of the target (verifier)
        if lookup:  # a deterministic proposal: q(d_i) = 1
            proposal = torch.full((k, v.shape[-1]), NEG_INF, device=device)  # [K, V]
            proposal[torch.arange(k, device=device), torch.tensor(drafts, device=device)] = 0.0
        else:
            proposal = self.head.to_full(torch.stack(proposal_rows)).to(device)  # [K, V]
            if c is not None:
                proposal = _mask_rows(proposal, masks[:k])
        draft_t = torch.tensor([drafts], dtype=torch.long, device=device)  # [1, K]

        if asym:
            # 3. Base pass: the drafter on the compressed view scores the same K tokens (O(K)).
            ha = torch.stack(hiddens)  # [K+1, H]
            if self.base is not None:
                ids = self.base.pending(self.view_b) + drafts
                hb = self.base.forward_hidden(ids)[-(k + 1):]  # [K+1, H]
                # one pass over the head for both views: on CPU the [V, H] head read dominates
                # a few-row matmul, so 2(K+1) rows cost about what K+1 rows do
                ab = self.head.full_logits(torch.cat([ha, hb])).to(device)  # [2(K+1), V]
                a, b = ab[: k + 1], ab[k + 1:]
            else:
                a = self.head.full_logits(ha).to(device)  # [K+1, V]
                b = a  # same view: the base pass would reproduce the drafter exactly
            same_view = b is a
            if c is not None:
                a = _mask_rows(a, masks)
                b = a if same_view else _mask_rows(b, masks)
            a1 = a[None]  # [1, K+1, V]
            # the SAME tensor object for one view: the gate then skips delta and JSD (both 0)
            b1 = a1 if same_view else b[None]
            result = fused_gate(v[None], a1, b1, draft_t, beta=beta, gamma=gamma,
                                acceptance=acceptance, temperature=self.temperature,
                                generator=self.generator, proposal_logits=proposal[None],
                                fuse_bonus=fuse_bonus)
        else:
            # Mode spec: beta=0 makes the fused target the verifier; the drafter/base rows only
            # feed delta (0 with beta=0) and JSD (unused by exact/greedy), so the verifier rows
            # stand in for both and the drafter never pays for its full head.
            v1 = v[None]  # [1, K+1, V]; one object, so the gate takes its one-view shortcut
            result = fused_gate(v1, v1, v1, draft_t, beta=0.0, gamma=1.0,
                                acceptance=acceptance, temperature=self.temperature,
                                generator=self.generator, proposal_logits=proposal[None])
        n = int(result.num_accepted[0])  # the one sync per round
        token = int(result.next_token[0])
        jsd = float(result.jsd[0, : n + 1].mean()) if asym else 0.0

        # 4. Crop every cache to the committed tokens it holds (old view + accepted drafts).
        committed = len(self.view_v)  # verifier view length before this round's tokens
        self.verifier.crop(committed + n)
        self.drafter.crop(len(self.view_d) + n)
        if self.base is not None:
            self.base.crop(len(self.view_b) + n)
        return RoundOutcome(tokens=drafts[:n] + [token], drafted=k, accepted=n, jsd=jsd,
                            draft_s=t1 - t0, verify_s=time.perf_counter() - t1, lookup=lookup)

    def escalate(self, verifier: ModelCache, view: View) -> None:
        """Finish the response with `verifier` on `view` (the full context): plain steps only."""
        self.verifier, self.view_v = verifier, view


def _gather_mask(mask: torch.Tensor, vocab: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary mask [V'] -> draft-vocabulary mask [N] (ids past V' are disallowed)."""
    vocab = vocab.to(mask.device)
    inside = vocab < mask.numel()
    return torch.where(inside, mask[vocab.clamp_max(mask.numel() - 1)], torch.zeros_like(inside))


def _mask_rows(logits: torch.Tensor, masks: list) -> torch.Tensor:
    """Apply one constraint mask per row: logits [R, V], masks R x [V'] bool."""
    return torch.stack([apply_mask(row, m) for row, m in zip(logits, masks)])


def advance_constraint(constraint, tokens: list, jumped: bool) -> tuple[int, int]:
    """Advance `constraint` through `tokens` until it terminates: (tokens kept, forced among them).

    A token counts as forced when the constraint alone determined it: jump-forwarded tokens, and
    round tokens that were the first of `forced_tokens()` at their position (drafted and accepted
    under the constraint's singleton mask): no model decision was needed for either.
    """
    forced = 0
    for j, t in enumerate(tokens):
        if constraint.is_terminated():  # complete mid-round: whatever follows is dropped
            return j, forced
        if jumped:
            forced += 1
        else:
            determined = constraint.forced_tokens()
            forced += int(bool(determined) and int(determined[0]) == t)
        if not constraint.advance(t):
            raise RuntimeError(f"decoded token {t} violates the constraint")
    return len(tokens), forced


def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens per round with K drafts and i.i.d. acceptance alpha: sum_{i<=K} alpha^i."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


