"""The fusion objective: train the drafter so that log v_c + beta (log a - log b) reproduces v_f.

At a response position, v_f / v_c are the verifier's next-token distributions on the full /
compressed view and a / b the drafter's. Delta-fusion decodes from
fused = softmax(log v_c + beta (log a - log b)); a drafter equal to the verifier makes it v_f
exactly at beta=1. The loss is KL(v_f || fused), plus `draft_weight` x KL(v_f || a) (the drafting
objective, so acceptance does not fall).

Teacher rows are cached once per conversation (`TeacherRows`): at each response position the
union U of the top-k tokens of v_f and of v_c, with both log-probabilities exact on U, and the
mass each puts outside U. The KL over the vocabulary is then computed on U plus one "rest"
bucket: inside U exactly; outside U, v_c's remaining mass is taken to be shaped like the
drafter's own compressed-view row b there, and each token's fused weight is its share times
exp(beta * delta). With U the whole vocabulary this is the exact KL, and a drafter equal to the
verifier has zero loss at beta=1 whatever U is (tests pin both).

Conversations are rendered by `ContextViews` exactly as `Engine.chat` renders them; the response
positions are the tokens of every assistant message (after its generation prompt, through its
end-of-turn token) that both views hold unchanged, so ONE forward per model and view covers every
turn of a conversation (the views are append-stable: each turn's prompt is a prefix).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NEG = -1e30  # stands in for log 0 in masked sums


@dataclass
class ConversationTokens:
    """Both views of one whole conversation and where its response tokens are."""

    full_ids: list  # [N_f]
    compressed_ids: list  # [N_c]
    full_rows: torch.Tensor  # [P] long: row (position) of the full view that predicts each target
    compressed_rows: torch.Tensor  # [P] long: the same in the compressed view
    targets: torch.Tensor  # [P] long: the response tokens


def conversation_tokens(views, messages: list, tools, eos_ids: set, generation_prompt: list,
                        max_tokens: int | None = None) -> ConversationTokens | None:
    """Render `messages` with `views` (a fresh ContextViews) and locate the response tokens.

    Assistant messages whose tokens differ between the views (a demoted turn) are skipped, and
    so is anything past `max_tokens` of the full view. None when no response token is left.
    """
    pair = views.build(messages, tools)
    full_rows, comp_rows, targets = [], [], []
    g = len(generation_prompt)
    for span in views.message_spans():
        if span.role != "assistant" or not span.same:
            continue
        (f0, f1), (c0, _) = span.full, span.compressed
        seg = pair.full_ids[f0:f1]
        if seg[:g] != list(generation_prompt):
            continue
        for j in range(g, len(seg)):
            if max_tokens is not None and f0 + j >= max_tokens:
                break
            full_rows.append(f0 + j - 1)
            comp_rows.append(c0 + j - 1)
            targets.append(seg[j])
            if seg[j] in eos_ids:
                break  # decoding stops at the end-of-turn token; what follows is never predicted
    if not targets:
        return None
    # keep each view through its last target (nothing after it is read)
    return ConversationTokens(pair.full_ids[: max(full_rows) + 2], pair.compressed_ids[: max(comp_rows) + 2],
                              torch.tensor(full_rows), torch.tensor(comp_rows), torch.tensor(targets))


@dataclass
class TeacherRows:
    """The verifier's rows at the response positions of one conversation (sparse, see module)."""

    index: torch.Tensor  # [P, U] long: token ids of U (top-k of v_f and of v_c, padded by repeats)
    log_vf: torch.Tensor  # [P, U] float: log v_f on U (a repeated pad id carries NEG)
    log_vc: torch.Tensor  # [P, U] float: log v_c on U (NEG on pads)
    rest_vf: torch.Tensor  # [P] float: v_f's mass outside U
    rest_vc: torch.Tensor  # [P] float: v_c's mass outside U
    vocab_size: int

    def to_dict(self) -> dict:
        return {"index": self.index.to(torch.int32), "log_vf": self.log_vf.half(), "log_vc": self.log_vc.half(),
                "rest_vf": self.rest_vf.float(), "rest_vc": self.rest_vc.float(), "vocab_size": self.vocab_size}

    @classmethod
    def from_dict(cls, d: dict) -> "TeacherRows":
        return cls(d["index"].long(), d["log_vf"].float(), d["log_vc"].float(), d["rest_vf"].float(),
                   d["rest_vc"].float(), int(d["vocab_size"]))


def sparse_rows(log_vf: torch.Tensor, log_vc: torch.Tensor, k: int) -> TeacherRows:
    """Dense log-prob rows [P, V] of v_f and v_c -> TeacherRows over U = top-k(v_f) u top-k(v_c)."""
    P, V = log_vf.shape
    k = min(k, V)
    cand = torch.cat([log_vf.topk(k, -1).indices, log_vc.topk(k, -1).indices], 1)  # [P, 2k]
    # dedupe per row: sort, mark repeats, and give repeats NEG weight (they keep their id)
    cand, _ = cand.sort(-1)
    repeat = torch.zeros_like(cand, dtype=torch.bool)
    repeat[:, 1:] = cand[:, 1:] == cand[:, :-1]
    lf = log_vf.gather(1, cand).masked_fill(repeat, NEG)
    lc = log_vc.gather(1, cand).masked_fill(repeat, NEG)
    rest_f = (1.0 - lf.exp().sum(-1)).clamp(min=0.0)
    rest_c = (1.0 - lc.exp().sum(-1)).clamp(min=0.0)
    return TeacherRows(cand, lf, lc, rest_f, rest_c, V)


def _log_rest(rest: torch.Tensor) -> torch.Tensor:
    return rest.clamp(min=1e-30).log()


def fusion_kl(teacher: TeacherRows, la: torch.Tensor, lb: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    """KL(v_f || softmax(log v_c + beta (la - lb))) per position [P], on U + the rest bucket.

    la, lb: the drafter's log-probs [P, V] on the full / compressed view (differentiable).
    """
    idx, P = teacher.index, teacher.index.shape[0]
    valid = teacher.log_vf > NEG / 2  # [P, U] not a repeat pad
    delta = beta * (la - lb)  # [P, V]
    d_u = delta.gather(1, idx)  # [P, U]
    in_u = torch.zeros_like(delta, dtype=torch.bool).scatter_(1, idx, True)  # [P, V]
    has_rest = (teacher.vocab_size - valid.sum(-1)) > 0  # [P] some token lies outside U
    # the rest bucket's fused weight: v_c's mass outside U, shaped like the drafter's own
    # compressed-view row b there, times exp(delta): rest_vc * sum_out b e^delta / sum_out b
    lb_out = lb.masked_fill(in_u, NEG)  # [P, V]
    w_rest = (_log_rest(teacher.rest_vc) + torch.logsumexp(lb_out + delta.masked_fill(in_u, 0.0), dim=-1)
              - torch.logsumexp(lb_out, dim=-1))  # [P]
    w_rest = w_rest.masked_fill(~has_rest, NEG)
    w_u = (teacher.log_vc + d_u).masked_fill(~valid, NEG)  # [P, U]
    log_z = torch.logsumexp(torch.cat([w_u, w_rest[:, None]], 1), dim=-1)  # [P]
    pf = teacher.log_vf.exp().masked_fill(~valid, 0.0)  # [P, U]
    kl_u = (pf * (teacher.log_vf - (w_u - log_z[:, None]))).masked_fill(~valid, 0.0).sum(-1)
    rf = teacher.rest_vf
    kl_rest = torch.where(has_rest & (rf > 0), rf * (_log_rest(rf) - (w_rest - log_z)), torch.zeros_like(rf))
    return kl_u + kl_rest


def draft_kl(teacher: TeacherRows, la: torch.Tensor) -> torch.Tensor:
    """KL(v_f || a) per position [P], on U + the rest bucket (a's mass outside U, exact)."""
    valid = teacher.log_vf > NEG / 2
    la_u = la.gather(1, teacher.index)  # [P, U]
    in_u = torch.zeros_like(la, dtype=torch.bool).scatter_(1, teacher.index, True)
    a_rest = torch.logsumexp(la.masked_fill(in_u, NEG), dim=-1)  # [P] log a's mass outside U
    pf = teacher.log_vf.exp().masked_fill(~valid, 0.0)
    kl_u = (pf * (teacher.log_vf - la_u)).masked_fill(~valid, 0.0).sum(-1)
    rf = teacher.rest_vf
    has_rest = (teacher.vocab_size - valid.sum(-1)) > 0
    kl_rest = torch.where(has_rest & (rf > 0), rf * (_log_rest(rf) - a_rest), torch.zeros_like(rf))
    return kl_u + kl_rest


def dense_fusion_kl(log_vf: torch.Tensor, log_vc: torch.Tensor, la: torch.Tensor, lb: torch.Tensor,
                    beta: float = 1.0) -> torch.Tensor:
    """The exact KL(v_f || fused) per row from dense rows [P, V] (the definition, for tests)."""
    fused = torch.log_softmax(log_vc + beta * (la - lb), dim=-1)
    return (log_vf.exp() * (log_vf - fused)).sum(-1)


@torch.no_grad()
def teacher_rows(verifier, tokens: ConversationTokens, k: int = 64, chunk: int = 1024) -> TeacherRows:
    """Run the verifier once over each view and keep the sparse rows at the response positions."""
    log_vf = _rows(verifier, tokens.full_ids, tokens.full_rows, chunk)
    log_vc = _rows(verifier, tokens.compressed_ids, tokens.compressed_rows, chunk)
    return sparse_rows(log_vf, log_vc, k)


def _rows(model, ids: list, rows: torch.Tensor, chunk: int) -> torch.Tensor:
    """log_softmax of the model's logits at `rows` of one forward over `ids` (chunked, cached)."""
    from asymagent.kv.cache import ModelCache

    cache = ModelCache(model)
    hidden = []
    for s in range(0, len(ids), chunk):
        hidden.append(cache.forward_hidden(ids[s:s + chunk]))  # [c, H]
    h = torch.cat(hidden)[rows.to(hidden[0].device)]  # [P, H]
    logits = model.get_output_embeddings()(h).float()  # [P, V]
    return torch.log_softmax(logits, dim=-1).cpu()
