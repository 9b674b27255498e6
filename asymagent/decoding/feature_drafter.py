"""FeatureDrafter: the EAGLE-3 feature head (feature_head.py) proposes K tokens from the verifier's own features.

The verifier's cache carries a FeatureCapture (asymagent/kv/feature_capture.py): every verifier
forward (prefill, plain step, verify) leaves its low/mid/high-layer hidden states there, by
position. Each round the drafter
1. brings the head's own KV cache (`HeadState`, kept on the capture, so it lives as long as the
   verifier's cache and follows its prefix reuse) up to the positions whose features exist:
   position t reads (g_t, x_{t+1}); with the verifier's cache holding every token of its view
   but the last, the last such position predicts the token after the view; after a
   jump-forward the view ends with up to MAX_PENDING tokens no forward has read yet (no
   features): the head runs over them on its own outputs, as over its drafts, then drafts;
2. drafts a greedy chain: d_1 from that output, then d_j from the head's own output at the
   previous position and d_{j-1} (the chain's keys are written past the committed positions and
   overwritten next round).
Drafts are deterministic given the history, so they are verified as a one-hot proposal exactly
like copied drafts (round.py): greedy output is the verifier's own, every acceptance rule
unchanged. The head never feeds the verifier: the verifier's logits are the same bits with it.
"""

from __future__ import annotations

import torch

from asymagent.decoding.constraint import close_masks
from asymagent.decoding.drafts import Drafts, RoundOutcome
from asymagent.decoding.feature_head import FeatureHead, head_logits, load_head
from asymagent.decoding.sampling import apply_mask, gather_mask
from asymagent.kv.cache import common_prefix_len
from asymagent.kv import feature_capture
from asymagent.kv.feature_capture import FeatureCapture
from asymagent.kv.growing_cache import _capacity

PREFILL_CHUNK = 512  # head positions fed per forward when it catches up on a long history
# most view tokens without features (jump-forward tokens the next verifier forward feeds) the
# head runs over on its own outputs before drafting; more: no drafts (a plain step). Each costs
# one head layer, no LM head (~1/28 of the pair's verifier forward)
MAX_PENDING = 16


class FeatureRuntime:
    """The engine's feature head on its verifier: the head (in the verifier's dtype), the
    verifier's embedding table and its LM head rows over the draft vocabulary (both frozen)."""

    def __init__(self, head: FeatureHead, verifier: torch.nn.Module, vocab: torch.Tensor | None = None,
                 meta: dict | None = None) -> None:
        p = next(verifier.parameters())
        self.head = head.to(device=p.device, dtype=p.dtype).eval()
        self.embed = verifier.get_input_embeddings()
        weight = verifier.get_output_embeddings().weight.detach()  # [V, H]
        self.vocab = None if vocab is None else vocab.to(p.device).long()
        self.weight = weight if self.vocab is None else weight[self.vocab].contiguous()  # [N, H]
        self.layers = head.cfg.layers
        self.meta = meta or {}

    @classmethod
    def load(cls, path: str, verifier: torch.nn.Module) -> "FeatureRuntime":
        head, vocab, meta = load_head(path)
        if head.cfg.hidden != verifier.config.hidden_size or head.cfg.vocab_size != verifier.config.vocab_size:
            raise ValueError(f"{path}: a feature head for another verifier (hidden {head.cfg.hidden}, "
                             f"vocab {head.cfg.vocab_size})")
        return cls(head, verifier, vocab, meta)

    def new_capture(self) -> FeatureCapture:
        return FeatureCapture(self.layers)

    def token_of(self, index: int) -> int:
        return index if self.vocab is None else int(self.vocab[index])

    def argmax(self, out: torch.Tensor, mask: torch.Tensor | None = None) -> int | None:
        """a [H] -> the head's greedy token (full-vocabulary id) among those a constraint's
        `mask` ([V'] bool, None: any) allows; None when it allows none of the draft vocabulary."""
        logits = head_logits(out, self.head.norm_out, self.weight)  # [N]
        if mask is not None:
            logits = apply_mask(logits, mask if self.vocab is None else gather_mask(mask, self.vocab))
            if not torch.isfinite(logits).any():
                return None
        return self.token_of(int(logits.argmax()))


class HeadState:
    """The head's KV cache over committed positions [0, n) and the ids it was fed (x_0..x_n)."""

    def __init__(self, rt: FeatureRuntime) -> None:
        c = rt.head.cfg
        w = rt.head.q.weight
        self.k = w.new_zeros((1, c.kv_heads, 256, c.head_dim))  # [1, Hkv, capacity, D]
        self.v = torch.zeros_like(self.k)
        self.n = 0
        self.ids: list = []  # x_0..x_n: position t was fed (g_t, x_{t+1})
        self.last: torch.Tensor | None = None  # a at position n-1 [H]

    def room(self, end: int) -> None:
        if end > self.k.shape[2]:
            cap = _capacity(end, self.k.shape[2]) if feature_capture.TRIM else max(2 * end, 256)
            self._resize(cap, self.k.shape[2])

    def _resize(self, cap: int, rows: int) -> None:
        """Buffers of `cap` positions holding the first `rows` of the old ones."""
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_zeros((1, old.shape[1], cap, old.shape[3]))
            new[:, :, :rows] = old[:, :, :rows]
            setattr(self, name, new)

    def crop(self, keep: int) -> None:
        """The verifier's cache keeps its first `keep` positions: keep the head's positions whose
        inputs (g_t, x_{t+1}) it still holds, t < keep - 1 (FeatureCapture.crop), and give memory
        back when the buffers are over twice that."""
        n = min(self.n, max(keep - 1, 0))
        if n < self.n:
            self.n, self.last = n, None
            del self.ids[n + 1:]
        want = _capacity(self.n, 0)
        if self.k.shape[2] > 2 * want:
            self._resize(want, self.n)


@torch.inference_mode()
def _run(rt: FeatureRuntime, st: HeadState, g: torch.Tensor, ids: list, start: int) -> torch.Tensor:
    """Feed positions [start, start+T): g [T, H], next tokens `ids` [T]; write their keys and
    values at those positions and attend causally over [0, start+T). Returns a [T, H]."""
    head = rt.head
    t = len(ids)
    emb = rt.embed(torch.tensor([ids], dtype=torch.long, device=g.device))  # [1, T, H]
    x = head.layer_input(g[None].to(head.inp.weight.dtype), emb)  # [1, T, H]
    positions = torch.arange(start, start + t, device=g.device)[None]  # [1, T]
    q, k, v = head.qkv(x, positions)
    st.room(start + t)
    st.k[:, :, start:start + t] = k
    st.v[:, :, start:start + t] = v
    keys = torch.arange(start + t, device=g.device)
    mask = keys[None, :] <= positions[0][:, None]  # [T, S]
    attn = head.attend(q, st.k[:, :, : start + t], st.v[:, :, : start + t], mask)
    return head.finish(x, attn)[0]  # [T, H]


def sync(rt: FeatureRuntime, st: HeadState, capture: FeatureCapture, ids: list, valid: int) -> bool:
    """Bring the head over positions [0, valid) of the view `ids` (features from `capture`);
    False when no position is known (nothing to draft from)."""
    if valid < 1:
        return False
    keep = max(min(st.n, common_prefix_len(st.ids, ids[: valid + 1]) - 1), 0)
    if keep < st.n:
        st.n, st.last = keep, None
        del st.ids[keep + 1:]
    if st.n == valid and st.last is not None:
        return True
    start = min(st.n, valid - 1)  # re-run the last position when its output was dropped
    with torch.inference_mode():
        for lo in range(start, valid, PREFILL_CHUNK):
            hi = min(lo + PREFILL_CHUNK, valid)
            g = rt.head.fuse(capture.features(lo, hi))  # [T, H]
            out = _run(rt, st, g, ids[lo + 1:hi + 1], lo)
            st.last = out[-1]
    st.n = valid
    st.ids = list(ids[: valid + 1])
    return True


@torch.inference_mode()
def chain(rt: FeatureRuntime, st: HeadState, k: int, pending: list = (), constraint=None) -> tuple:
    """Greedy chain of up to `k` drafts after position st.n - 1 (its keys past n are scratch):
    (drafts, the constraint's K+1 masks or None).

    `pending`: tokens of the view after x_n that no verifier forward has read yet, so they have
    no features (jump-forward tokens, forced by the constraint: the next forward feeds them).
    Each is fed like a draft, the head's own output standing in for the missing feature (what
    the head is trained on past its first step, EAGLE-3's training-time test); the chain then
    continues after the last of them.

    Under a `constraint` each draft is the head's best token among those it allows (as the
    drafter model drafts, constraint.py's protocol: mask, pick, advance; rolled back at the end),
    so a grammar position the head's plain argmax would break still gets drafts; the chain stops
    where the constraint allows none of the draft vocabulary or completes."""
    a, pos = st.last, st.n - 1
    for token in pending:
        pos += 1
        a = _run(rt, st, a[None], [int(token)], pos)[0]
    tokens: list = []
    masks: list = []  # [V'] bool masks at d_1..d_K (constraint only)
    for j in range(k):
        if j:
            a = _run(rt, st, a[None], [tokens[-1]], pos + j)[0]
        mask = None if constraint is None else constraint.allowed_mask()
        token = rt.argmax(a, mask)
        if token is None or (constraint is not None and not constraint.advance(token)):
            break
        tokens.append(token)
        masks.append(mask)
        if constraint is not None and constraint.is_terminated():
            break
    if constraint is None or not tokens:
        return tokens, None
    return tokens, close_masks(constraint, masks, len(tokens))


class FeatureDrafter:
    """Drafts d_1..d_K with the feature head on the verifier's features (module doc)."""

    name = "feature"  # Drafts.source, and the key of its budget in Decoder.spec_round

    def __init__(self, runtime: FeatureRuntime, verifier, constraint=None) -> None:
        self.rt = runtime
        self.verifier = verifier  # the verifier's ViewCache (its ModelCache carries the capture)
        self.constraint = constraint

    def state(self) -> tuple:
        cache = self.verifier.cache
        capture = cache.capture
        st = getattr(capture, "head_state", None)
        if st is None:
            st = capture.head_state = HeadState(self.rt)
        return capture, st

    def propose(self, k: int) -> Drafts:
        cache = self.verifier.cache
        if k < 1 or cache.capture is None:
            return Drafts(tokens=[], source=self.name)
        capture, st = self.state()
        ids = self.verifier.view.ids()
        valid = capture.valid(len(cache.tokens))
        pending = len(ids) - 1 - valid  # view tokens after x_valid without features (jump-forward)
        if not 0 <= pending <= MAX_PENDING or not sync(self.rt, st, capture, ids, valid):
            return Drafts(tokens=[], source=self.name)  # features far behind the view: a plain step
        drafts, masks = chain(self.rt, st, k, ids[valid + 1:], self.constraint)
        return Drafts(tokens=drafts, source=self.name, masks=masks)

    def update(self, outcome: RoundOutcome) -> None:
        """Nothing to learn per round: the next round re-syncs from the verifier's features."""
