"""`asymagent train-drafter --kind feature`: train an EAGLE-3 feature head (decoding/feature_head.py) for a verifier.

Recipe (EAGLE-3, in a simple form sized for a 2-core CPU):
1. teacher forwards of the frozen verifier (training/feature_data.py) over agent episodes of the
   training domains, the verifier's own greedy turns after their prefixes and captured traces:
   per position the captured layers' features and the verifier's top-k next-token log-probs;
2. a draft vocabulary: the `--feature-vocab` tokens the verifier predicts or reads most often
   in that data (its LM head rows are what a draft token costs; the full vocabulary if larger);
3. training with the training-time test: `--ttt-steps` chain steps, step j reading the head's
   own outputs of step j-1 (FeatureHead.train_forward), each step's loss the cross-entropy to
   the verifier's top-k distribution at the position (weights 0.8^j), AdamW, cosine lr.
The whole run honours `--budget-min` (teacher forwards get at most `--teacher-share` of it); the
progress bar shows the time left. Output: OUT/feature_head.safetensors and OUT/card.json
(the teacher's and the training's seconds per 1k tokens, the held-out per-step accuracy: the
chance that chain position j+1 matches the verifier's greedy token when the positions before it
did, which is the per-position acceptance a greedy round sees).
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import torch

from asymagent.decoding.feature_head import FeatureHead, FeatureHeadConfig, head_logits, save_head
from asymagent.kv.feature_capture import default_layers
from asymagent.training.config import TrainConfig
from asymagent.training.feature_data import TeacherSet, agent_sequences, collect, interleave, trace_sequences

STEP_WEIGHT = 0.8  # loss weight of chain step j: STEP_WEIGHT ** j


def draft_vocab(teacher: TeacherSet, vocab_size: int, n: int) -> torch.Tensor | None:
    """The `n` ids the verifier predicts (top-1) or reads most often; None when n >= V."""
    if n <= 0 or n >= vocab_size:
        return None
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for s in teacher.seqs:
        counts.index_add_(0, s.top_ids[:, 0], torch.full((len(s.ids),), 4.0, dtype=torch.float64))
        counts.index_add_(0, s.ids, torch.ones(len(s.ids), dtype=torch.float64))
    order = torch.argsort(counts, descending=True, stable=True)
    return order[:n].sort().values


def window(seq, length: int, rng: random.Random) -> tuple:
    """A random window of at most `length` + 1 positions of a teacher sequence."""
    t = len(seq.ids)
    start = rng.randrange(max(t - length - 1, 0) + 1)
    end = min(start + length + 1, t)
    return seq.ids[start:end], seq.feats[start:end], seq.top_ids[start:end], seq.top_lp[start:end]


def step_losses(head: FeatureHead, embed, weight: torch.Tensor, to_draft: torch.Tensor, rows: tuple,
                steps: int) -> tuple:
    """One window's TTT losses. rows = (ids [T+1], feats [T+1, F], top ids / lp [T+1, k]).
    Position t (0..T-1) reads (g_t, x_{t+1}) and is scored against the verifier at t+1.
    Returns (weighted loss, per-step top-1 agreement with the verifier [steps])."""
    ids, feats, top_ids, top_lp = rows
    with torch.no_grad():
        emb = embed(ids[1:][None]).float()  # [1, T, H]
    outs = head.train_forward(feats[:-1][None].float(), emb, steps)
    tgt = to_draft[top_ids[1:]]  # [T, k] draft index or -1
    p = torch.where(tgt >= 0, top_lp[1:].float().exp(), torch.zeros(()))  # [T, k]
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-9)
    greedy = tgt[:, 0]  # [T] the verifier's greedy token (draft index, -1 outside)
    total, agree = 0.0, []
    for j, out in enumerate(outs):
        logq = torch.log_softmax(head_logits(out[0], head.norm_out, weight), dim=-1)  # [T, N]
        q = logq.gather(1, tgt.clamp_min(0))  # [T, k]
        rows_j = torch.arange(len(greedy)) >= j  # a chain of j own steps exists from t = j on
        ce = -(p * q).sum(-1)[rows_j].mean()
        total = total + (STEP_WEIGHT ** j) * ce
        hit = (logq.argmax(-1) == greedy) & (greedy >= 0)
        agree.append(float(hit[rows_j].float().mean()))
    return total, agree


def windows(seq, length: int) -> list:
    """Consecutive windows of `length` + 1 positions covering a teacher sequence (one shared
    position between neighbours: every position t >= 1 is scored once)."""
    t = len(seq.ids)
    return [(seq.ids[a:a + length + 1], seq.feats[a:a + length + 1], seq.top_ids[a:a + length + 1],
             seq.top_lp[a:a + length + 1]) for a in range(0, max(t - 1, 1), length)
            if min(a + length + 1, t) - a >= 2]


@torch.no_grad()
def evaluate(head, embed, weight, to_draft, seqs: list, steps: int, length: int) -> list:
    """Per chain step, top-1 agreement with the verifier over every window of the held-out
    teacher sequences (weighted by the window's scored positions)."""
    sums, n = [0.0] * steps, 0
    for s in seqs:
        for rows in windows(s, length):
            w = len(rows[0]) - 1
            if w <= steps:  # a tail too short for every chain step: left out
                continue
            _, agree = step_losses(head, embed, weight, to_draft, rows, steps)
            sums = [a + w * b for a, b in zip(sums, agree)]
            n += w
    return [a / n for a in sums] if n else []


def new_head(verifier, cfg: TrainConfig) -> FeatureHead:
    """A head of the verifier's layer shape, its output norm started from the verifier's."""
    layers = default_layers(verifier.config.num_hidden_layers)
    head = FeatureHead(FeatureHeadConfig.for_verifier(verifier, layers, cfg.feature_intermediate))
    with torch.no_grad():
        head.norm_out.weight.copy_(verifier.model.norm.weight.float())
    return head.float()


def teacher_data(verifier, tokenizer, cfg: TrainConfig, layers: tuple, deadline: float, log) -> TeacherSet:
    """Teacher rows until `cfg.feature_tokens` or the deadline (a progress bar in tokens)."""
    from tqdm.auto import tqdm

    from asymagent.training.data import generate_self_turns, self_gen_prompts

    seqs = []
    if cfg.traces:
        seqs += trace_sequences(tokenizer, cfg.traces, max(cfg.feature_context, cfg.seq_len + 1))
    if cfg.self_turns > 0:  # the verifier's own turns: its continuations are the targets' text
        prompts = [p[-(cfg.seq_len - cfg.self_max_new):] for p in
                   self_gen_prompts(tokenizer, cfg.self_turns, cfg.seed)]
        self_deadline = min(deadline, time.monotonic() + cfg.self_minutes * 60)
        seqs += generate_self_turns(verifier, tokenizer, prompts, cfg.self_max_new, batch_size=4,
                                    deadline=self_deadline, progress=not cfg.no_progress)
    random.Random(cfg.seed).shuffle(seqs)
    stream = interleave(seqs, agent_sequences(tokenizer, cfg.seed, cfg.seq_len + 1))
    bar = tqdm(total=cfg.feature_tokens, desc="teacher forwards", unit="tok", disable=cfg.no_progress)
    data = collect(verifier, stream, layers, cfg.feature_topk, cfg.feature_tokens, deadline, bar)
    bar.close()
    log(f"teacher: {data.tokens} tokens in {data.seconds:.0f} s ({data.s_per_1k():.2f} s per 1k tokens)")
    return data


def train_loop(head, verifier, train: list, weight, to_draft, cfg: TrainConfig, deadline: float) -> dict:
    """AdamW steps over random windows until the deadline / `--max-steps`; a bar with time left."""
    from tqdm.auto import tqdm

    embed = verifier.get_input_embeddings()
    # a bf16 verifier (the engine's CPU dtype): the head's matmuls in bf16 under autocast (AMX),
    # float32 master weights, AdamW state and softmax
    amp = embed.weight.dtype == torch.bfloat16
    opt = torch.optim.AdamW([p for p in head.parameters()], lr=cfg.lr, weight_decay=0.0)
    rng = random.Random(cfg.seed)
    t0 = time.monotonic()
    total_s = max(deadline - t0, 1e-3)
    timed = math.isfinite(total_s)  # the bar counts seconds of the budget, else steps
    bar = tqdm(total=round(total_s) if timed else cfg.max_steps, desc="feature head",
               unit="s" if timed else "step", disable=cfg.no_progress)
    step, tokens, hist = 0, 0, []
    while time.monotonic() < deadline and (cfg.max_steps <= 0 or step < cfg.max_steps):
        progress = min((time.monotonic() - t0) / total_s, 1.0)
        if cfg.max_steps > 0:
            progress = max(progress, step / cfg.max_steps)
        lr = cfg.lr * min(1.0, (step + 1) / 20) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        agree = [0.0] * cfg.ttt_steps
        for _ in range(cfg.batch_size):
            rows = window(rng.choice(train), cfg.seq_len, rng)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                loss, a = step_losses(head, embed, weight, to_draft, rows, cfg.ttt_steps)
            (loss / cfg.batch_size).backward()
            agree = [x + y / cfg.batch_size for x, y in zip(agree, a)]
            tokens += len(rows[0]) - 1
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        step += 1
        hist.append({"step": step, "loss": float(loss.detach()), "agree": agree})
        bar.n = min(round(time.monotonic() - t0), bar.total) if timed else step
        left = max(deadline - time.monotonic(), 0.0) if timed else 0.0
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}", acc=",".join(f"{x:.2f}" for x in agree),
                        left=f"{int(left // 60)}:{int(left % 60):02d}")
    bar.close()
    seconds = time.monotonic() - t0
    return {"steps": step, "tokens": tokens, "seconds": seconds,
            "s_per_1k_tokens": 1000.0 * seconds / tokens if tokens else 0.0, "history": hist[-20:]}


def run(cfg: TrainConfig, loaded=None) -> dict:
    """The whole run (module doc); returns the card (also OUT/card.json)."""
    from asymagent.modeling.loading import load_model

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    log = (lambda *a: None) if cfg.no_progress else (lambda *a: print(*a, flush=True))
    budget_s = 60.0 * (cfg.budget_min if cfg.budget_min > 0 else cfg.max_minutes)
    t0 = time.monotonic()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    if loaded is None:  # the verifier in the dtype the engine serves it in (its features' bits)
        from asymagent.modeling.pairs import verifier_path

        loaded = load_model(verifier_path(cfg.verifier), dtype="auto")
    verifier, tokenizer = loaded.model.eval(), loaded.tokenizer
    for p in verifier.parameters():
        p.requires_grad_(False)
    head = new_head(verifier, cfg)
    layers = head.cfg.layers
    data = teacher_data(verifier, tokenizer, cfg, layers, t0 + cfg.teacher_share * budget_s, log)
    if len(data.seqs) < 2:
        raise RuntimeError("feature head: fewer than 2 teacher sequences within the budget")
    n_held = max(1, len(data.seqs) // 10)
    held, train = data.seqs[:n_held], data.seqs[n_held:]
    vocab = draft_vocab(data, head.cfg.vocab_size, cfg.feature_vocab)
    full = verifier.get_output_embeddings().weight.detach()  # [V, H]
    weight = (full if vocab is None else full[vocab]).float().contiguous()  # [N, H]
    to_draft = torch.full((head.cfg.vocab_size,), -1, dtype=torch.long)
    to_draft[vocab if vocab is not None else torch.arange(head.cfg.vocab_size)] = \
        torch.arange(weight.shape[0])
    embed = verifier.get_input_embeddings()
    before = evaluate(head, embed, weight, to_draft, held, cfg.ttt_steps, cfg.seq_len)
    training = train_loop(head, verifier, train, weight, to_draft, cfg, t0 + budget_s)
    after = evaluate(head, embed, weight, to_draft, held, cfg.ttt_steps, cfg.seq_len)
    card = {"kind": "feature", "verifier": cfg.verifier, "layers": list(layers),
            "intermediate": head.cfg.intermediate, "draft_vocab": weight.shape[0],
            "teacher": {"sequences": len(data.seqs), "tokens": data.tokens, "seconds": data.seconds,
                        "s_per_1k_tokens": data.s_per_1k()},
            "training": training, "heldout_sequences": len(held),
            "heldout_agreement_by_step_before": before, "heldout_agreement_by_step": after,
            "budget_min": budget_s / 60, "wall_s": time.monotonic() - t0, "threads": cfg.threads}
    save_head(head, str(out / "feature_head.safetensors"), vocab,
              meta={k: card[k] for k in ("verifier", "draft_vocab", "heldout_agreement_by_step")})
    (out / "card.json").write_text(json.dumps(card, indent=2))
    log(f"feature head: held-out agreement by chain step {['%.3f' % a for a in after]} "
        f"(untrained {['%.3f' % a for a in before]}); {out / 'feature_head.safetensors'}")
    return card
