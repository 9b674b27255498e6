"""GraphRound: a speculative round as static-shape device work, one device->host copy per round.

On a GPU a small model's forward is bound by launches (docs/kernels.md): a round that runs the
drafter's K steps one Python forward at a time, reads each draft back to the host, then runs the
verify forward, the base pass and the gate eagerly costs more than the tokens it saves (issue 28:
spec 0.84x of plain decoding's speed with CUDA graphs). Here a whole round is one function of
device tensors over the caches' StaticKVs (asymagent/kv/static_cache.py), recorded once per K
as a CUDA graph (asymagent/kv/cuda_graphs.py `CapturedCall`) and replayed:

- model drafts: the drafter's K one-token steps on the full view (each draft the argmax, or the
  Gumbel-max at T > 0, of the draft head, fed to the next step on the device), its bonus row
  (delta-fusion), the K+1 verify forward, the base pass (drafter on the compressed view) when
  the round fuses, and the gate (asymagent.kernels.fused_gate); the drafts, the accepted length
  n, the next token and the JSD row come back in ONE copy;
- copied drafts (suffix / lookup, drafted on the host): the drafter's K+1 rows when fused, the
  verify forward, the base pass and the gate;
- with the copy delta (asymagent/decoding/copy_delta.py, mode asym on two views), whose rows
  depend on the drafts through host-side suffix matching: the drafting call, one copy of the
  drafts, the copy delta's K+1 rows built in one host pass and sent in one transfer, then the
  verify call (so two copies in that case).

Every cache's forward feeds its last pending token inside the call; older pending tokens (a
bonus token the drafter never fed) are fed first by the cache's ordinary forward. After the copy
the host mirrors (ModelCache.tokens, StaticKV.seen) follow what the call fed and every cache is
cropped to the committed tokens, as in Decoder._round.

The same code runs without capture on any device (the CPU tests): its tokens equal the
step-by-step round's in every mode, greedy and sampled (same ops, same order; only the position
split of a cache's pending tokens differs). Rounds this path does not serve (a constraint,
log-probs, penalties / top-k / min-p / top-p, dynamic caches) return None and run step by step.
Timing: the round is one call, so its whole time is reported as verify_s (draft_s = 0).
"""

from __future__ import annotations

import functools
import time

import torch

from asymagent.decoding.drafts import Drafts, RoundOutcome
from asymagent.decoding.model_drafter import ModelDrafter
from asymagent.decoding.sampling import NEG_INF, perturb
from asymagent.kernels import GateNoise, fused_gate
from asymagent.kv.cuda_graphs import CapturedCall
from asymagent.kv.static_cache import StaticKV

RULES = ("cda", "greedy", "exact", "coupled")


def graph_round_for(decoder) -> "GraphRound | None":
    """A GraphRound for `decoder` when its verifier's cache is static with rounds on, else None."""
    options = decoder.verifier.cache.static
    if options is None or not getattr(options, "rounds", False):
        return None
    return GraphRound(decoder, capture=bool(options.graphs))


def _static(reader) -> StaticKV | None:
    kv = None if reader is None else reader.cache.cache
    return kv if isinstance(kv, StaticKV) else None


def _fed(reader, ids: list) -> None:
    """The host mirrors follow what a call fed to `reader`'s cache."""
    reader.cache.tokens.extend(ids)
    reader.cache.cache.advance(len(ids))


class GraphRound:
    """Speculative rounds of one Decoder (asymagent/decoding/round.py) as captured calls."""

    def __init__(self, decoder, capture: bool = False) -> None:
        self.decoder = decoder
        self.capture = capture
        self.calls: dict = {}  # key -> CapturedCall
        self.generations: tuple = ()  # the caches' StaticKV.generation the calls were made on
        self.rounds = 0  # rounds served (tests and benches read it)

    # ------------------------------------------------------------------ eligibility
    def usable(self, rule) -> bool:
        """Whether a round of `rule` (a RoundRule) can run here (else the step-by-step round runs)."""
        d = self.decoder
        if rule.acceptance.rule not in RULES or d.constraint is not None or d.logprobs is not None:
            return False
        if d.processors.penalises or (d.processors.truncates and d.temperature > 0.0):
            return False
        if d.temperature > 0.0 and (d.top_p < 1.0 or d.noise is None):
            return False
        readers = [d.verifier, d.drafter] + ([d.base] if d.base is not None else [])
        if d.drafter is None or any(_static(r) is None for r in readers):
            return False
        return all(s.constraint is None for s in d.drafters if isinstance(s, ModelDrafter))

    # ------------------------------------------------------------------ the round
    @torch.inference_mode()
    def spec_round(self, budgets: dict, rule) -> RoundOutcome | None:
        """Decoder.spec_round's round on the device; None if this round is not served here.

        `rule` is the round's RoundRule (asymagent/decoding/round.py): the resolved acceptance
        (asymagent/decoding/plan.py `Acceptance`), beta, gamma, fuse_bonus."""
        d = self.decoder
        if not self.usable(rule):
            return None
        t0 = time.perf_counter()
        for source in d.drafters:
            k = budgets.get(source.name, 0)
            if isinstance(source, ModelDrafter):
                if k < 1:
                    continue
                outcome = self._round(k, None, source, rule=rule, t0=t0)
            else:
                drafts = source.propose(k)
                if not drafts:
                    continue
                outcome = self._round(len(drafts), drafts, None, rule=rule, t0=t0)
            source.update(outcome)
            return outcome
        return d.plain_step(rule.beta if rule.fuse_bonus else 0.0, rule.jsd_min)

    def _call(self, key: tuple, fn, kvs: list) -> CapturedCall:
        generations = tuple(kv.generation for kv in kvs)
        if key not in self.calls or self.calls[key][1] != generations:
            device = kvs[0].device
            self.calls[key] = (CapturedCall(fn, kvs, self.capture, device), generations)
        return self.calls[key][0]

    def _round(self, k: int, copied: Drafts | None, drafter: ModelDrafter | None, *, rule,
               t0: float) -> RoundOutcome:
        d = self.decoder
        acc = rule.acceptance
        fused, has_base = bool(d.fused), d.fused and d.base is not None
        rows = bool(d.rows)  # the drafter's rows reach the gate (RequestPlan.drafter_rows)
        bonus = drafter is not None and drafter.bonus_row
        sampled = d.temperature > 0.0
        temperature = float(d.temperature)
        device = _static(d.verifier).device  # noise rows are made there
        position = d.position()  # output position of d_1
        # verifier FLOPs and tokens as the step-by-step round counts them (pending + drafts)
        fed_v = len(d.verifier.pending()) + k
        d.verifier_flops += d.flops.forward(fed_v, len(d.verifier.cache))
        d.verifier_tokens_fed += fed_v
        readers = {"v": d.verifier}
        if drafter is not None or rows:
            readers["d"] = d.drafter
        if has_base:
            readers["b"] = d.base
        last, last_ids = {}, {}  # each cache's last pending token: on the device, on the host
        for name, reader in readers.items():
            pending = reader.pending()
            if len(pending) > 1:  # e.g. the bonus token a drafter without a bonus row never fed
                reader.cache.forward_hidden(pending[:-1])
            last_ids[name] = int(pending[-1])
            # host tensors: the call copies them in without a sync (CapturedCall)
            last[name] = torch.tensor([[pending[-1]]], dtype=torch.long)  # [1, 1]
            _static(reader).reserve(_static(reader).seen + k + 2)
        kvs = [_static(r) for r in readers.values()]
        noise = {"gumbel": None, "uniform": None, "expo": None}
        if sampled:
            noise["gumbel"] = d.noise.gumbel_rows(position, k + 1).to(device)  # [K+1, V]
            if acc.gate_noise:
                gn = d.noise.gate_noise(position, k)
                noise["uniform"] = gn.uniform.to(device)  # [1, K]
                noise["expo"] = gn.exponential.to(device)  # [1, V]
        gate = dict(k=k, gate=acc.gate, perturbed=bool(acc.perturb),
                    gate_noise=bool(acc.gate_noise), temperature=temperature,
                    beta=float(rule.beta), gamma=float(rule.gamma), jsd_min=float(rule.jsd_min),
                    fuse_bonus=bool(rule.fuse_bonus), fused=fused, rows=rows, has_base=has_base)
        hidden = proposal = None
        if drafter is not None:
            draft_fn = functools.partial(self._draft_body, k=k, temperature=temperature,
                                         bonus=bonus)
            if d.copy is None:  # the whole round in one call
                key = ("round", bonus, tuple(sorted(gate.items())))
                fn = functools.partial(self._round_body, draft_fn=draft_fn, **gate)
                packed = self._call(key, fn, kvs)(tok_v=last["v"], tok_d=last["d"],
                                                  tok_b=last.get("b"), **noise)
                values = packed.tolist()  # the round's one device->host copy
                tokens = [int(t) for t in values[:k]]
            else:  # the copy delta needs the drafts on the host: draft, copy, then verify
                key = ("draft", k, bonus, temperature)
                drafts_dev, proposal, hidden = self._call(key, draft_fn, [_static(d.drafter)])(
                    tok_d=last["d"], gumbel=noise["gumbel"])
                tokens = drafts_dev.tolist()  # copy 1 of 2
        else:
            tokens = list(copied.tokens)
        if drafter is None or d.copy is not None:
            copy_rows = None
            if d.copy is not None:  # all K+1 rows in one host pass, one transfer
                copy_rows = d.copy.rows(tokens, torch.empty(0, _vocab(d)))  # [K+1, V] host
            key = ("verify", drafter is not None, copy_rows is not None,
                   tuple(sorted(gate.items())))
            fn = functools.partial(self._verify_body, **gate)
            drafts_in = torch.tensor(tokens, dtype=torch.long)  # [K] host
            # only the caches this call feeds: a capture puts their lengths back to the host
            # mirrors, which the drafting call (if any) has moved past
            fed = [_static(d.verifier)] + ([_static(d.drafter)] if rows and hidden is None
                                           else []) + ([_static(d.base)] if has_base else [])
            packed = self._call(key, fn, fed)(
                tok_v=last["v"], tok_d=last.get("d") if hidden is None else None,
                tok_b=last.get("b"), drafts=drafts_in, proposal=proposal, hidden=hidden,
                copy_rows=copy_rows, **noise)
            values = packed.tolist()  # the verify call's one device->host copy
        n, token = int(values[k]), int(values[k + 1])
        jsd = 0.0
        if fused:  # the mean over the rows the gate used, as the step-by-step round takes it
            jsd = float(torch.tensor(values[k + 2: k + 3 + n], dtype=torch.float32).mean())
        # the host mirrors follow what the call fed, then every cache keeps its committed tokens
        self._bookkeep(readers, last_ids, tokens, drafter is not None, bonus)
        for reader in (d.verifier, d.drafter, d.base):
            if reader is not None:
                reader.commit(n)
        self.rounds += 1
        return RoundOutcome(tokens=tokens[:n] + [token], drafted=k, accepted=n, jsd=jsd,
                            draft_s=0.0, verify_s=time.perf_counter() - t0,
                            source=drafter.name if drafter is not None else copied.source)

    # ------------------------------------------------------------------ device bodies
    def _draft_body(self, *, k: int, temperature: float, bonus: bool, tok_d: torch.Tensor,
                    gumbel: torch.Tensor | None):
        """The drafter's K steps on the full view: drafts [K], draft-head rows [K, N], hidden
        states [K(+1), H]. Device work only."""
        d = self.decoder
        kv, head = _static(d.drafter), d.head
        tok = tok_d  # [1, 1]
        tokens, rows, hiddens = [], [], []
        for i in range(k):
            h = kv.step(tok, head=False)[-1]  # [H]
            logits = head.draft_logits(h)  # [N] float32
            score = logits if gumbel is None else perturb(logits, temperature,
                                                           head.draft_rows(gumbel[i]))
            index = score.argmax()  # [] first index on ties, as sample_token
            token = index if head.vocab is None else head.vocab[index]
            tokens.append(token)
            rows.append(logits)
            hiddens.append(h)
            tok = token.view(1, 1)
        if bonus:  # the drafter's row at position K+1 (delta-fusion, JSD)
            hiddens.append(kv.step(tok, head=False)[-1])
        return torch.stack(tokens), torch.stack(rows), torch.stack(hiddens)

    def _round_body(self, *, draft_fn, tok_v, tok_d, tok_b, gumbel, uniform, expo, **gate):
        drafts, proposal, hidden = draft_fn(tok_d=tok_d, gumbel=gumbel)
        return self._verify_body(tok_v=tok_v, tok_d=None, tok_b=tok_b, drafts=drafts,
                                 proposal=proposal, hidden=hidden, copy_rows=None,
                                 gumbel=gumbel, uniform=uniform, expo=expo, **gate)

    def _verify_body(self, *, k: int, gate: str, perturbed: bool, gate_noise: bool,
                     temperature: float, beta: float, gamma: float, jsd_min: float,
                     fuse_bonus: bool, fused: bool,
                     rows: bool, has_base: bool, tok_v, tok_d, tok_b, drafts, proposal, hidden, copy_rows,
                     gumbel, uniform, expo) -> torch.Tensor:
        """Verify K+1, base pass, gate: [K drafts, n, next token, K+1 JSD] as float64. Device only."""
        d = self.decoder
        head = d.head
        ids = torch.cat([tok_v.view(1), drafts]).view(1, k + 1)  # [1, K+1]
        v = _static(d.verifier).step(ids, head=True).float()  # [K+1, V]
        if copy_rows is not None:
            v = v + copy_rows  # the copy delta joins the target (Decoder._target)
        if proposal is None:  # copied drafts: one-hot proposals (log 1 = 0 at d_i)
            proposal = torch.full((k, v.shape[-1]), NEG_INF, device=v.device)  # [K, V]
            proposal.scatter_(1, drafts.view(k, 1), 0.0)
        else:
            proposal = head.to_full(proposal)  # [K, V]
        a = b = None
        if rows:
            if hidden is None:  # copied drafts: the drafter's K+1 rows on the full view
                fed = torch.cat([tok_d.view(1), drafts]).view(1, k + 1)
                hidden = _static(d.drafter).step(fed, head=False)  # [K+1, H]
            if has_base:
                fed = torch.cat([tok_b.view(1), drafts]).view(1, k + 1)
                hb = _static(d.base).step(fed, head=False)  # [K+1, H]
                ab = head.full_logits(torch.cat([hidden, hb]))  # [2(K+1), V]
                a, b = ab[: k + 1], ab[k + 1:]
            else:
                a = head.full_logits(hidden)  # [K+1, V]
        noise = None
        if perturbed:  # coupled / greedy at T > 0: the target rows' Gumbel-max (Acceptance)
            v = perturb(v, temperature, gumbel)  # [K+1, V]
        elif gate_noise:  # exact at T > 0: keyed uniforms and exponentials
            noise = GateNoise(uniform=uniform, exponential=expo)
        result = fused_gate(v[None], None if a is None else a[None],
                            None if b is None else b[None], drafts.view(1, k),
                            beta=beta if fused else 0.0, gamma=gamma if fused else 1.0,
                            acceptance=gate, temperature=temperature, noise=noise,
                            proposal_logits=proposal[None], fuse_bonus=fuse_bonus,
                            jsd_min=jsd_min if fused else 0.0)
        return torch.cat([drafts.double(), result.num_accepted.double(),
                          result.next_token.double(), result.jsd[0].double()])  # [2K+3]

    def _bookkeep(self, readers: dict, last_ids: dict, tokens: list, model: bool,
                  bonus: bool) -> None:
        """Host mirrors of what the call fed: verifier/base K+1, drafter K (+1) or K+1."""
        for name, reader in readers.items():
            fed = [last_ids[name]] + tokens
            if name == "d" and model:
                fed = fed[: len(tokens) + (1 if bonus else 0)]
            _fed(reader, fed)


def _vocab(decoder) -> int:
    """The verifier's row width (the copy delta's rows are that wide)."""
    return int(decoder.verifier.cache.model.get_output_embeddings().weight.shape[0])
