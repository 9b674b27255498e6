"""ModelDrafter: the small drafter model proposes K tokens on its full-view cache (and its head).

`DraftHead` is the drafter's output head: a reduced draft vocabulary for proposing (the head
dominates a small drafter's cost: 49k rows for SmolLM2) and the full head for the K+1 rows that
delta-fusion and the JSD need (both are defined on the full vocabulary).
"""

from __future__ import annotations


import torch

from asymagent.decoding.constraint import close_masks
from asymagent.decoding.drafts import Drafts, RoundOutcome
from asymagent.decoding.noise import KeyedNoise
from asymagent.decoding.sampling import NEG_INF, apply_mask, gather_mask, sample_token
from asymagent.modeling.packed_linear import linear_of
from asymagent.scheduling import company_clock


class DraftHead:
    """The drafter's output head: reduced draft vocabulary for proposing, full head for the gate.

    `draft_vocab` (LongTensor [N], ids into the full vocabulary) selects the head rows used
    while drafting; the K+1 verify positions use every row.
    """

    def __init__(self, drafter: torch.nn.Module, draft_vocab: torch.Tensor | None) -> None:
        head = drafter.get_output_embeddings()
        # the module itself computes the full rows: a PackedLinear on a bf16 CPU model
        # (asymagent/modeling/packed_linear.py), the same bits as F.linear
        self.head = head if isinstance(head, torch.nn.Linear) else None
        self.weight = head.weight  # [V, H]
        self.bias = getattr(head, "bias", None)  # [V] or None
        self.vocab_size = int(self.weight.shape[0])
        self.vocab = None if draft_vocab is None else draft_vocab.to(self.weight.device).long()
        if self.vocab is None:
            self.draft_weight, self.draft_bias = self.weight, self.bias
        else:
            self.draft_weight = self.weight[self.vocab].contiguous()  # [N, H]
            self.draft_bias = None if self.bias is None else self.bias[self.vocab]
        # the [N, H] draft head as a module: packed on a bf16 CPU model, like the full one
        self.draft_linear = (self.head if self.vocab is None and self.head is not None
                             else linear_of(self.draft_weight, self.draft_bias))

    @torch.inference_mode()
    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[H] -> [N] logits over the draft vocabulary (N = V without a reduced vocabulary)."""
        return self.draft_linear(hidden).float()

    @torch.inference_mode()
    def full_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[R, H] -> [R, V] logits over the full vocabulary."""
        if self.head is not None:
            return self.head(hidden).float()
        return torch.nn.functional.linear(hidden, self.weight, self.bias).float()

    def token_id(self, index: int) -> int:
        return index if self.vocab is None else int(self.vocab[index])

    def to_full(self, rows: torch.Tensor) -> torch.Tensor:
        """[R, N] draft-vocabulary logits -> [R, V] with -inf outside the draft vocabulary."""
        if self.vocab is None:
            return rows
        out = rows.new_full((rows.shape[0], self.vocab_size), NEG_INF)
        return out.index_copy_(1, self.vocab.to(rows.device), rows)

    def draft_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """A full-vocabulary constraint mask [V'] restricted to the draft vocabulary [N]."""
        return mask if self.vocab is None else gather_mask(mask, self.vocab)

    def draft_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """[..., V] full-vocabulary values (e.g. Gumbel noise) -> [..., N] draft-vocabulary ones."""
        return rows if self.vocab is None else rows[..., self.vocab.to(rows.device)]


class ModelDrafter:
    """Drafts d_1..d_K one forward at a time on the drafter's full-view cache.

    `reader` is the drafter's `ViewCache` on the full view; the round crops it back to the
    committed tokens after the gate. At temperature > 0 the draft at output position t is
    argmax(q_t + T * g_t) over the draft vocabulary, with g_t the position's Gumbel noise from
    `noise` (asymagent/decoding/noise.py): a sample of softmax(q_t / T) that shares its noise
    with the verifier's token at t, so the coupled rule accepts it whenever the two agree. With `bonus_row` (delta-fusion needs the drafter's row at
    position K+1) one more forward feeds d_K, and `Drafts.hidden` carries all K+1 hidden states.

    `catch_up` (RequestPlan.defer_drafter): the reader's prefill was deferred; the first proposal
    runs it (`ViewCache.catch_up`, or the engine's callable that also counts its tokens) and
    reports its seconds as `Drafts.setup_s`, which the round leaves out of the drafting time.
    """

    name = "model"  # Drafts.source, and the key of its budget in Decoder.spec_round

    def __init__(self, reader, head: DraftHead, *, temperature: float = 0.0,
                 noise: KeyedNoise | None = None, constraint=None,
                 bonus_row: bool = False, catch_up=None) -> None:
        self.reader, self.head = reader, head
        self.temperature, self.noise = temperature, noise
        self.constraint, self.bonus_row = constraint, bonus_row
        self.catch_up = catch_up  # () -> tokens fed, run once before the first proposal

    def propose(self, k: int) -> Drafts:
        setup_s = 0.0
        if self.catch_up is not None:  # the deferred prefill, once
            t0 = company_clock.now()  # the clock the round's draft_s is read on (round.py)
            self.catch_up()
            self.catch_up, setup_s = None, company_clock.now() - t0
        drafts = self._propose(k)
        drafts.setup_s = setup_s
        return drafts

    def _propose(self, k: int) -> Drafts:
        c, cache = self.constraint, self.reader.cache
        drafts: list = []
        rows: list = []  # [N] logits each draft was sampled from
        hiddens: list = []  # [H] hidden state at positions 1..K(+1)
        masks: list = []  # [V'] constraint masks at positions 1..K
        feed = self.reader.pending()
        start = len(self.reader.view.generated)  # output position of d_1
        for i in range(k):
            hidden = cache.forward_hidden(feed)[-1]  # [H]
            logits = self.head.draft_logits(hidden)  # [N]
            mask = None
            if c is not None:
                mask = c.allowed_mask()  # [V'] bool
                logits = apply_mask(logits, self.head.draft_mask(mask))
                if not torch.isfinite(logits).any():  # nothing allowed inside the draft vocab
                    break
            gumbel = None
            if self.temperature > 0.0:  # the draft shares the verifier's noise at its position
                gumbel = self.head.draft_rows(self.noise.gumbel(start + i))  # [N]
            token = self.head.token_id(sample_token(logits, self.temperature, gumbel))
            if c is not None and not c.advance(token):
                break
            hiddens.append(hidden)
            drafts.append(token)
            rows.append(logits)
            masks.append(mask)
            if c is not None and c.is_terminated():
                break
            feed = [token]
        if not drafts:  # the constraint left nothing to draft: undo the forward
            cache.crop(len(self.reader.view) - 1)
            return Drafts(tokens=[], source=self.name)
        if c is not None:
            close_masks(c, masks, len(drafts))
        if self.bonus_row:  # the K+1-th drafter row (fusion / JSD at the bonus position)
            hiddens.append(cache.forward_hidden([drafts[-1]])[-1])
        return Drafts(tokens=drafts, source=self.name, proposal=torch.stack(rows),
                      masks=masks if c is not None else None,
                      hidden=torch.stack(hiddens) if self.bonus_row else None)

    def update(self, outcome: RoundOutcome) -> None:
        """Nothing to learn within a request: AdaptiveK tunes how many drafts to ask for."""
