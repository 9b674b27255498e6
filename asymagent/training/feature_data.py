"""Teacher data of the feature head: the verifier's features and its own next-token distribution, per position.

One teacher forward of the frozen verifier over a token sequence gives, per position t, the
hidden states of the captured layers (the head's input g_t, [L*H], bf16) and the verifier's top-k
next-token distribution (the target: the head learns the verifier's own continuation, not the
text's). Sequences: synthetic agent episodes of the training domains, greedy verifier turns after
their prefixes (the verifier's own text), captured traces (`--traces`) and any token lists a
caller adds (the suites' train splits, asymagent/integrations). Nothing is downloaded.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import torch

from asymagent.training.data import render_messages
from asymagent.training.domains import TRAIN_DOMAINS, episode


@dataclass
class TeacherSeq:
    """One sequence's teacher rows: ids [T], feats [T, L*H] bf16, top ids / log-probs [T, k]."""

    ids: torch.Tensor
    feats: torch.Tensor
    top_ids: torch.Tensor
    top_lp: torch.Tensor


@dataclass
class TeacherSet:
    """Teacher sequences and what collecting them cost."""

    seqs: list = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0

    def s_per_1k(self) -> float:
        return 1000.0 * self.seconds / self.tokens if self.tokens else 0.0


LOGIT_CHUNK = 512  # positions per LM-head chunk: [512, V] fp32 = 310 MB at Qwen's V = 152k


@torch.inference_mode()
def teacher_forward(model, ids: list, layers: tuple, topk: int) -> TeacherSeq:
    """The verifier over `ids` (one forward, transformers'): features of `layers` and top-k log-probs.

    The LM head runs over LOGIT_CHUNK positions at a time (the model's own forward keeps one
    position's logits), so a whole agent episode (thousands of tokens) fits one teacher forward
    without a [T, V] logits tensor."""
    x = torch.tensor([ids], dtype=torch.long, device=next(model.parameters()).device)  # [1, T]
    out = model(input_ids=x, output_hidden_states=True, use_cache=False, logits_to_keep=1)
    feats = torch.cat([out.hidden_states[i + 1][0] for i in layers], dim=-1)  # [T, L*H]
    last = out.hidden_states[-1][0]  # [T, H] after the final norm (what the LM head reads)
    head = model.get_output_embeddings()
    cap = getattr(model.config, "final_logit_softcapping", None)
    tops, top_ids = [], []
    for a in range(0, last.shape[0], LOGIT_CHUNK):
        logits = head(last[a:a + LOGIT_CHUNK]).float()  # [c, V]
        if cap:
            logits = torch.tanh(logits / cap) * cap
        top, idx = logits.topk(topk, dim=-1)  # [c, k]
        tops.append(top - torch.logsumexp(logits, dim=-1, keepdim=True))  # [c, k] log-probs
        top_ids.append(idx)
    return TeacherSeq(ids=x[0].cpu(), feats=feats.to(torch.bfloat16).cpu(),
                      top_ids=torch.cat(top_ids).cpu(), top_lp=torch.cat(tops).cpu())


def agent_sequences(tokenizer, seed: int, max_len: int):
    """Rendered agent episodes of the training domains (truncated to `max_len` tokens), made
    lazily: an endless iterator (the caller stops at its token count or deadline)."""
    rng = random.Random(seed * 7717 + 3)
    while True:
        yield render_messages(tokenizer, episode(rng.choice(TRAIN_DOMAINS), rng))[:max_len]


def interleave(first: list, rest):
    """`first`'s items and `rest`'s alternately (then `rest` alone): every source reaches the
    teacher early whatever the budget cuts."""
    for item in first:
        yield item
        yield next(rest)
    yield from rest


def trace_sequences(tokenizer, paths: list, max_len: int) -> list:
    """Captured traces (asymagent/traces.py) and the suites' train split (evals/suites/
    train_traces.py): each conversation's full view as the engine renders it (ContextViews, the
    tools in the prompt), its first `max_len` tokens (a history prefix, as the engine reads one)."""
    from asymagent.context.views import ContextViews
    from asymagent.traces import conversations, load_traces

    out = []
    for path in paths:
        for msgs, tools in conversations(load_traces(path)):
            try:
                ids = list(ContextViews(tokenizer).build(msgs, tools).full_ids)
            except Exception:  # noqa: BLE001 - a conversation the views refuse: the template alone
                try:
                    ids = render_messages(tokenizer, msgs)
                except Exception:  # noqa: BLE001 - a message the template cannot render: skipped
                    continue
            out.append(ids[:max_len])
    return out


def collect(model, seqs, layers: tuple, topk: int, max_tokens: int, deadline: float,
            bar=None) -> TeacherSet:
    """Teacher rows of `seqs` (any iterable) in order until `max_tokens` tokens or `deadline`
    (time.monotonic())."""
    out = TeacherSet()
    for ids in seqs:
        if out.tokens >= max_tokens or time.monotonic() > deadline:
            break
        if len(ids) < 8:
            continue
        t0 = time.perf_counter()
        out.seqs.append(teacher_forward(model, ids, layers, topk))
        out.seconds += time.perf_counter() - t0
        out.tokens += len(ids)
        if bar is not None:
            bar.update(len(ids))
    return out
