"""`asymagent train-drafter --objective fusion`: train the drafter for delta-fusion (training/fusion.py).

Each step takes one whole conversation, renders both views as `Engine.chat` does, reads the
verifier's cached sparse rows at every response position (computed on first use and kept in
`--teacher-cache`, so later epochs and resumed runs cost only the drafter), runs the drafter
over both views with gradients, and minimises
    mean KL(v_f || softmax(log v_c + beta (log a - log b)))  +  draft_weight * mean KL(v_f || a).
Conversations: long-context synthetic episodes over the training domains (training/long_episodes.py,
dev seeds 0..), and any `--traces` JSONL files or capture directories (asymagent/traces.py; e.g. the
eval suites' dev episodes or a user's captured traffic), interleaved by weight. Traces captured
with another tokenizer or verifier are refused; a deterministic slice of their conversations
(`--traces-holdout`, split by conversation hash) is never trained on and is measured like the
held-out domain (`traces_heldout_*` in the history and the card). The order is a seeded permutation per
epoch, so a resumed run (`--resume`) replays exactly what an uninterrupted one would have done.
Held-out check every `--eval-every` steps: the recovered share on long episodes of the held-out
domain (never trained on).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict
from pathlib import Path

import torch

from asymagent.training.fusion import (TeacherRows, conversation_tokens, draft_kl, fusion_kl, teacher_rows)

HELDOUT_SEEDS = range(900, 904)  # dev seeds of the held-out domain used for the in-run check


def conversation_plan(cfg, n_traces: int) -> list:
    """[(source, key)]: ("long", (domain, seed)) and ("trace", index), mixed by `traces_weight`."""
    from asymagent.training.domains import TRAIN_DOMAINS

    longs = [("long", (TRAIN_DOMAINS[i % len(TRAIN_DOMAINS)].name, i // len(TRAIN_DOMAINS)))
             for i in range(cfg.conversations)]
    if not n_traces:
        return longs
    want = round(cfg.traces_weight * len(longs) / max(1e-9, 1.0 - cfg.traces_weight)) if cfg.traces_weight < 1 else n_traces
    traces = [("trace", i % n_traces) for i in range(max(1, want))]
    return longs + traces


def load_trace_conversations(paths: list, holdout: float, fingerprint: dict) -> tuple:
    """(train, heldout) conversations [(messages, tools)] from trace files or capture directories.

    Lines whose fingerprint names another tokenizer or verifier are refused (TraceMismatchError);
    whole conversations whose hash falls under `holdout` are kept out of training and measured
    (asymagent/traces.py `split_heldout`: deterministic, independent of file order)."""
    from asymagent.traces import check_fingerprint, conversations, load_traces, split_heldout

    examples = [ex for path in paths for ex in load_traces(path)]
    check_fingerprint(examples, fingerprint)
    train, held = split_heldout(examples, holdout)
    return conversations(train), conversations(held)


class TeacherCache:
    """Per-conversation tokens + sparse teacher rows, on disk (one .pt per conversation)."""

    def __init__(self, root: Path, verifier, tokenizer, compression, topk: int, max_tokens: int):
        from asymagent.chat.chat_format import ChatFormat
        from asymagent.decoding.stopping import eos_ids

        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.verifier, self.tokenizer, self.compression = verifier, tokenizer, compression
        self.chat_format = ChatFormat(tokenizer)
        self.eos = eos_ids(verifier, tokenizer)
        self.topk, self.max_tokens = topk, max_tokens
        self.built = 0  # teacher rows computed by this process

    def get(self, name: str, messages: list, tools) -> tuple | None:
        """(ConversationTokens, TeacherRows), or None for a conversation with no response token."""
        from asymagent.context.views import ContextViews
        from asymagent.training.fusion import ConversationTokens

        path = self.root / f"{name}.pt"
        if path.is_file():
            d = torch.load(path, weights_only=False)
            if d is None:
                return None
            return ConversationTokens(**d["tokens"]), TeacherRows.from_dict(d["teacher"])
        views = ContextViews(self.tokenizer, self.compression, self.chat_format)
        tokens = conversation_tokens(views, messages, tools, self.eos, self.chat_format.generation_prompt_ids,
                                     max_tokens=self.max_tokens)
        data = None
        if tokens is not None:
            teacher = teacher_rows(self.verifier, tokens, k=self.topk)
            data = {"tokens": asdict(tokens), "teacher": teacher.to_dict()}
            self.built += 1
        tmp = path.with_suffix(".tmp")
        torch.save(data, tmp)
        tmp.replace(path)
        return None if tokens is None else (tokens, TeacherRows.from_dict(data["teacher"]))


def drafter_rows(drafter, ids: list, rows: torch.Tensor) -> torch.Tensor:
    """The drafter's log-probs [P, V] at `rows` of one forward over `ids` (gradients kept)."""
    hidden = drafter.model(input_ids=torch.tensor([ids])).last_hidden_state[0]  # [T, H]
    return torch.log_softmax(drafter.lm_head(hidden[rows]).float(), dim=-1)  # [P, V]


def losses(drafter, tokens, teacher, beta: float) -> tuple:
    """(fusion KL [P], draft KL [P]) of one conversation."""
    la = drafter_rows(drafter, tokens.full_ids, tokens.full_rows)
    lb = drafter_rows(drafter, tokens.compressed_ids, tokens.compressed_rows)
    return fusion_kl(teacher, la, lb, beta), draft_kl(teacher, la)


@torch.no_grad()
def heldout(drafter, cache: TeacherCache, beta: float) -> dict:
    """Recovered share and mean KLs on the held-out domain's long episodes (never trained on)."""
    from asymagent.training.domains import HELD_OUT_DOMAIN, domain_by_name
    from asymagent.training.long_episodes import long_episode

    d = domain_by_name(HELD_OUT_DOMAIN)
    return measure(drafter, cache, beta, [(f"heldout-{d.name}-{seed}", *long_episode(d, seed))
                                          for seed in HELDOUT_SEEDS])


@torch.no_grad()
def measure(drafter, cache: TeacherCache, beta: float, convs: list, prefix: str = "heldout") -> dict:
    """Recovered share and mean KLs over [(name, messages, tools)], keys `{prefix}_...`."""
    kl_c = kl_f = kl_a = 0.0
    n = 0
    for name, messages, tools in convs:
        got = cache.get(name, messages, tools)
        if got is None:
            continue
        tokens, teacher = got
        fk, dk = losses(drafter, tokens, teacher, beta)
        kl_c += float(_sparse_kl_fc(teacher).sum())  # KL(v_f || v_c) on the same sparse rows
        kl_f += float(fk.sum())
        kl_a += float(dk.sum())
        n += len(fk)
    if not n:
        return {}
    return {f"{prefix}_positions": n, f"{prefix}_kl_compressed": kl_c / n, f"{prefix}_kl_fused": kl_f / n,
            f"{prefix}_recovered_share": 1.0 - kl_f / kl_c if kl_c > 0 else None, f"{prefix}_kl_draft": kl_a / n}


def _sparse_kl_fc(teacher: TeacherRows) -> torch.Tensor:
    """KL(v_f || v_c) per position on U + one rest bucket (v_c's and v_f's masses outside U)."""
    valid = teacher.log_vf > -1e29
    pf = teacher.log_vf.exp().masked_fill(~valid, 0.0)
    kl_u = (pf * (teacher.log_vf - teacher.log_vc)).masked_fill(~valid, 0.0).sum(-1)
    rf, rc = teacher.rest_vf, teacher.rest_vc
    kl_rest = torch.where(rf > 0, rf * (rf.clamp(min=1e-30).log() - rc.clamp(min=1e-30).log()), torch.zeros_like(rf))
    return kl_u + kl_rest


def run(cfg, loaded=None) -> dict:
    """Train (or resume) with the fusion objective; exports OUT/drafter.safetensors + card."""
    from tqdm import tqdm

    from asymagent.context.compressors import CompressionConfig
    from asymagent.modeling.drafter import (DEFAULT_DRAFTER_FILE, build_drafter, load_drafter, save_drafter,
                                            trainable_parameters, trainable_state_dict)
    from asymagent.modeling.loading import EMBEDDED_VERIFIER_ID, load_model
    from asymagent.training.config import lr_at
    from asymagent.training.domains import HELD_OUT_DOMAIN, TRAIN_DOMAINS, domain_by_name
    from asymagent.training.long_episodes import long_episode

    cfg.validate()
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_path = out / "checkpoint.pt"
    log = (lambda *a: None) if cfg.no_progress else (lambda *a: print(*a, flush=True))
    t0 = time.monotonic()
    loaded = loaded if loaded is not None else load_model(cfg.verifier)
    verifier, tokenizer = loaded.model, loaded.tokenizer
    verifier.eval()
    for p in verifier.parameters():
        p.requires_grad_(False)

    # the drafter: a warm start keeps its layers and draft vocabulary
    warm = None
    if cfg.init_from:
        source = DEFAULT_DRAFTER_FILE if cfg.init_from == "default" else Path(cfg.init_from)
        earlier = load_drafter(source, verifier)
        drafter = build_drafter(verifier, len(earlier.model.layers), init_from_verifier=False)
        drafter.load_state_dict(trainable_state_dict(earlier), strict=False)
        draft_vocab = earlier.asymagent_draft_vocab.cpu()
        warm = {"file": source.name, **{k: earlier.asymagent_card[k] for k in ("steps", "train_tokens", "data_mix")
                                         if k in (earlier.asymagent_card or {})}}
    else:
        drafter = build_drafter(verifier, cfg.layers, init_from_verifier=cfg.init == "verifier")
        draft_vocab = torch.arange(min(cfg.draft_vocab, verifier.config.vocab_size))
    params = trainable_parameters(drafter)
    for p in params:
        p.requires_grad_(True)
    drafter.train()
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.98))
    step, prev_elapsed, history = 0, 0.0, []
    if cfg.resume:
        if not ckpt_path.is_file():
            raise FileNotFoundError(f"--resume given but {ckpt_path} does not exist")
        state = torch.load(ckpt_path, weights_only=False)
        drafter.load_state_dict(state["drafter"], strict=False)
        opt.load_state_dict(state["optimizer"])
        step, prev_elapsed, history = state["step"], state["elapsed_s"], state["history"]
        draft_vocab = state["draft_vocab"]
        warm = state.get("warm_start", warm)
        torch.set_rng_state(state["torch_rng"])
        log(f"resumed at step {step} ({prev_elapsed / 60:.1f} min done)")
    budget_s = cfg.max_minutes * 60 if cfg.max_minutes > 0 else float("inf")
    elapsed = lambda: prev_elapsed + time.monotonic() - t0  # noqa: E731

    compression = CompressionConfig.from_any(cfg.compression or None)
    cache = TeacherCache(Path(cfg.teacher_cache or out / "teacher"), verifier, tokenizer, compression,
                         cfg.teacher_topk, cfg.max_context)
    from asymagent.trace_capture import tokenizer_fingerprint

    if cfg.resume:  # the split the run started with (none in checkpoints from before it existed)
        cfg.traces_holdout = state.get("config", {}).get("traces_holdout", 0.0)
    holdout = cfg.traces_holdout
    traces, held_traces = load_trace_conversations(
        cfg.traces, holdout, {"tokenizer": tokenizer_fingerprint(tokenizer), "verifier": loaded.fingerprint})
    held_convs = [(f"trace-heldout-{i}", m, t) for i, (m, t) in enumerate(held_traces)]
    plan = conversation_plan(cfg, len(traces))
    log(f"{len(plan)} conversations per epoch ({cfg.conversations} long episodes, "
        f"{len(plan) - cfg.conversations} from {len(traces)} trace conversations; "
        f"{len(held_traces)} trace conversations held out)")

    def conversation(i: int) -> tuple:
        kind, key = plan[i]
        if kind == "long":
            name, seed = key
            messages, tools = long_episode(domain_by_name(name), seed)
            return f"long-{name}-{seed}", messages, tools
        messages, tools = traces[key]
        return f"trace-{key}", messages, tools

    def order(epoch: int) -> list:
        idx = list(range(len(plan)))
        random.Random(f"{cfg.seed}:{epoch}").shuffle(idx)
        return idx

    def save_checkpoint():
        tmp = Path(str(ckpt_path) + ".tmp")
        torch.save({"drafter": trainable_state_dict(drafter), "optimizer": opt.state_dict(), "step": step,
                    "elapsed_s": elapsed(), "history": history, "draft_vocab": draft_vocab,
                    "warm_start": warm, "torch_rng": torch.get_rng_state(), "config": asdict(cfg)}, tmp)
        tmp.replace(ckpt_path)

    last_ckpt = time.monotonic()
    bar = tqdm(desc="fusion", unit="conv", disable=cfg.no_progress, mininterval=15)
    positions_seen = 0
    while True:
        progress = max(elapsed() / budget_s, step / cfg.max_steps if cfg.max_steps else 0.0)
        if progress >= 1.0:
            break
        epoch, within = divmod(step, len(plan))
        name, messages, tools = conversation(order(epoch)[within])
        got = cache.get(name, messages, tools)
        step += 1
        if got is None:
            continue
        tokens, teacher = got
        for g in opt.param_groups:
            g["lr"] = lr_at(cfg, step - 1, progress)
        opt.zero_grad(set_to_none=True)
        fk, dk = losses(drafter, tokens, teacher, cfg.fusion_beta)
        loss = fk.mean() + cfg.draft_weight * dk.mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        positions_seen += len(fk)
        history.append({"step": step, "fusion_kl": round(float(fk.mean()), 5), "draft_kl": round(float(dk.mean()), 5),
                        "positions": len(fk), "elapsed_s": round(elapsed(), 1)})
        bar.update(1)
        bar.set_postfix(step=step, fusion=f"{float(fk.mean()):.4f}", draft=f"{float(dk.mean()):.3f}")
        if cfg.eval_every and step % cfg.eval_every == 0:
            drafter.eval()
            m = {**heldout(drafter, cache, cfg.fusion_beta),
                 **measure(drafter, cache, cfg.fusion_beta, held_convs, "traces_heldout")}
            drafter.train()
            history[-1].update({k: round(v, 5) for k, v in m.items() if isinstance(v, float)})
            log(f"\nstep {step}: held-out ({HELD_OUT_DOMAIN}) recovered share {m.get('heldout_recovered_share')}")
        if time.monotonic() - last_ckpt > cfg.checkpoint_minutes * 60:
            save_checkpoint()
            last_ckpt = time.monotonic()
    bar.close()
    save_checkpoint()

    drafter.eval()
    metrics = {**heldout(drafter, cache, cfg.fusion_beta),
               **measure(drafter, cache, cfg.fusion_beta, held_convs, "traces_heldout")}
    recent = history[-50:]
    card = {
        "format": "asymagent-drafter-1",
        "verifier": loaded.source if cfg.verifier != "default" else EMBEDDED_VERIFIER_ID,
        "verifier_sha256": loaded.fingerprint,
        "objective": "fusion",
        "layers": len(drafter.model.layers), "draft_vocab_size": int(len(draft_vocab)),
        "fusion": {"beta": cfg.fusion_beta, "draft_weight": cfg.draft_weight, "teacher_topk": cfg.teacher_topk,
                   "conversations_per_epoch": len(plan), "long_episodes": cfg.conversations,
                   "trace_files": [Path(p).name for p in cfg.traces], "traces_weight": cfg.traces_weight,
                   "traces_holdout": holdout, "trace_conversations": len(traces),
                   "trace_conversations_heldout": len(held_traces),
                   "max_context": cfg.max_context, "train_domains": [d.name for d in TRAIN_DOMAINS],
                   "heldout_domain": HELD_OUT_DOMAIN,
                   "compression": compression.model_dump(mode="json")},
        "steps": step, "epochs": round(step / max(1, len(plan)), 2), "wall_minutes": round(elapsed() / 60, 2),
        "config": {k: v for k, v in asdict(cfg).items() if k not in ("resume", "no_progress", "out")},
        **({"warm_start": warm} if warm else {}),
        "final_fusion_kl_mean_last_50": round(sum(h["fusion_kl"] for h in recent) / max(1, len(recent)), 5),
        "final_draft_kl_mean_last_50": round(sum(h["draft_kl"] for h in recent) / max(1, len(recent)), 5),
        **{k: (round(v, 5) if isinstance(v, float) else v) for k, v in metrics.items()},
    }
    save_drafter(drafter, out / "drafter.safetensors", draft_vocab, card)
    if cfg.install:
        from asymagent.modeling.drafter import install_default

        install_default(out / "drafter.safetensors")
    (out / "history.json").write_text(json.dumps(history))
    log(json.dumps({k: card.get(k) for k in ("steps", "epochs", "wall_minutes", "heldout_recovered_share",
                                             "heldout_kl_compressed", "heldout_kl_fused",
                                             "traces_heldout_recovered_share") if k in card}))
    return card
