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

import random
from dataclasses import asdict
from pathlib import Path

import torch

from asymagent.training.fusion import (TeacherRows, conversation_tokens, draft_kl, fusion_kl, teacher_rows)
from asymagent.training.trainer import Trainer

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


def _drafter(trainer: Trainer) -> tuple:
    """(drafter, draft vocabulary, warm-start record): a warm start keeps its layers and its
    draft vocabulary; else `--layers` new ones and the first `--draft-vocab` ids."""
    from asymagent.modeling.drafter import DEFAULT_DRAFTER_FILE, build_drafter, load_drafter, trainable_state_dict

    cfg, verifier = trainer.cfg, trainer.verifier
    if cfg.init_from:
        source = DEFAULT_DRAFTER_FILE if cfg.init_from == "default" else Path(cfg.init_from)
        earlier = load_drafter(source, verifier)
        drafter = build_drafter(verifier, len(earlier.model.layers), init_from_verifier=False)
        drafter.load_state_dict(trainable_state_dict(earlier), strict=False)
        warm = {"file": source.name, **{k: earlier.asymagent_card[k] for k in ("steps", "train_tokens", "data_mix")
                                         if k in (earlier.asymagent_card or {})}}
        return drafter, earlier.asymagent_draft_vocab.cpu(), warm
    drafter = build_drafter(verifier, cfg.layers, init_from_verifier=cfg.init == "verifier")
    return drafter, torch.arange(min(cfg.draft_vocab, verifier.config.vocab_size)), None


class FusionObjective:
    """The fusion objective over whole conversations (module docstring): long episodes and
    traces interleaved by a seeded per-epoch order, teacher rows from the TeacherCache."""

    desc, unit = "fusion", "conv"

    def __init__(self, trainer: Trainer, state: dict | None, draft_vocab, warm) -> None:
        from asymagent.context.compressors import CompressionConfig
        from asymagent.trace_capture import tokenizer_fingerprint

        cfg = trainer.cfg
        self.cfg, self.draft_vocab, self.warm = cfg, draft_vocab, warm
        if state is not None:
            self.draft_vocab = state["draft_vocab"]
            self.warm = state.get("warm_start", warm)
        trainer.restore_rng(state)
        self.compression = CompressionConfig.from_any(cfg.compression or None)
        self.cache = TeacherCache(Path(cfg.teacher_cache or trainer.out / "teacher"), trainer.verifier,
                                  trainer.tokenizer, self.compression, cfg.teacher_topk, cfg.max_context)
        if state is not None:  # the split the run started with (none in checkpoints from before it existed)
            cfg.traces_holdout = state.get("config", {}).get("traces_holdout", 0.0)
        self.holdout = cfg.traces_holdout
        self.traces, self.held_traces = load_trace_conversations(
            cfg.traces, self.holdout, {"tokenizer": tokenizer_fingerprint(trainer.tokenizer),
                                       "verifier": trainer.loaded.fingerprint})
        self.held_convs = [(f"trace-heldout-{i}", m, t) for i, (m, t) in enumerate(self.held_traces)]
        self.plan = conversation_plan(cfg, len(self.traces))
        trainer.log(f"{len(self.plan)} conversations per epoch ({cfg.conversations} long episodes, "
                    f"{len(self.plan) - cfg.conversations} from {len(self.traces)} trace conversations; "
                    f"{len(self.held_traces)} trace conversations held out)")
        self.positions_seen = 0

    def conversation(self, i: int) -> tuple:
        from asymagent.training.domains import domain_by_name
        from asymagent.training.long_episodes import long_episode

        kind, key = self.plan[i]
        if kind == "long":
            name, seed = key
            messages, tools = long_episode(domain_by_name(name), seed)
            return f"long-{name}-{seed}", messages, tools
        messages, tools = self.traces[key]
        return f"trace-{key}", messages, tools

    def order(self, epoch: int) -> list:
        idx = list(range(len(self.plan)))
        random.Random(f"{self.cfg.seed}:{epoch}").shuffle(idx)
        return idx

    def step(self, trainer: Trainer, step: int, progress: float) -> tuple | None:
        epoch, within = divmod(step, len(self.plan))
        name, messages, tools = self.conversation(self.order(epoch)[within])
        got = self.cache.get(name, messages, tools)
        if got is None:
            return None
        tokens, teacher = got
        fk, dk = losses(trainer.drafter, tokens, teacher, self.cfg.fusion_beta)
        loss = fk.mean() + self.cfg.draft_weight * dk.mean()
        loss.backward()
        self.positions_seen += len(fk)
        f, d = float(fk.detach().mean()), float(dk.detach().mean())
        return ({"fusion_kl": round(f, 5), "draft_kl": round(d, 5), "positions": len(fk)},
                {"fusion": f"{f:.4f}", "draft": f"{d:.3f}"}, 1)

    def metrics(self, drafter) -> dict:
        return {**heldout(drafter, self.cache, self.cfg.fusion_beta),
                **measure(drafter, self.cache, self.cfg.fusion_beta, self.held_convs, "traces_heldout")}

    def evaluate(self, trainer: Trainer) -> dict:
        from asymagent.training.domains import HELD_OUT_DOMAIN

        m = self.metrics(trainer.drafter)
        trainer.log(f"\nstep {trainer.step}: held-out ({HELD_OUT_DOMAIN}) recovered share "
                    f"{m.get('heldout_recovered_share')}")
        return {k: round(v, 5) for k, v in m.items() if isinstance(v, float)}

    def checkpoint_state(self) -> dict:
        return {"draft_vocab": self.draft_vocab, "warm_start": self.warm}

    def card_fusion(self) -> dict:
        from asymagent.training.domains import HELD_OUT_DOMAIN, TRAIN_DOMAINS

        cfg = self.cfg
        return {"beta": cfg.fusion_beta, "draft_weight": cfg.draft_weight, "teacher_topk": cfg.teacher_topk,
                "conversations_per_epoch": len(self.plan), "long_episodes": cfg.conversations,
                "trace_files": [Path(p).name for p in cfg.traces], "traces_weight": cfg.traces_weight,
                "traces_holdout": self.holdout, "trace_conversations": len(self.traces),
                "trace_conversations_heldout": len(self.held_traces),
                "max_context": cfg.max_context, "train_domains": [d.name for d in TRAIN_DOMAINS],
                "heldout_domain": HELD_OUT_DOMAIN,
                "compression": self.compression.model_dump(mode="json")}


def run(cfg, loaded=None) -> dict:
    """Train (or resume) with the fusion objective; exports OUT/drafter.safetensors + card."""
    trainer = Trainer(cfg, loaded)
    drafter, draft_vocab, warm = _drafter(trainer)
    trainer.train_drafter(drafter)
    objective = FusionObjective(trainer, trainer.resume(), draft_vocab, warm)
    trainer.fit(objective)

    drafter.eval()
    metrics = objective.metrics(drafter)
    recent = trainer.history[-50:]
    card = {
        **trainer.card_head(),
        "objective": "fusion",
        "layers": len(drafter.model.layers), "draft_vocab_size": int(len(objective.draft_vocab)),
        "fusion": objective.card_fusion(),
        "steps": trainer.step, "epochs": round(trainer.step / max(1, len(objective.plan)), 2),
        "wall_minutes": round(trainer.elapsed() / 60, 2),
        "config": trainer.card_config(),
        **({"warm_start": objective.warm} if objective.warm else {}),
        "final_fusion_kl_mean_last_50": round(sum(h["fusion_kl"] for h in recent) / max(1, len(recent)), 5),
        "final_draft_kl_mean_last_50": round(sum(h["draft_kl"] for h in recent) / max(1, len(recent)), 5),
        **{k: (round(v, 5) if isinstance(v, float) else v) for k, v in metrics.items()},
    }
    trainer.export(objective.draft_vocab, card,
                   ("steps", "epochs", "wall_minutes", "heldout_recovered_share", "heldout_kl_compressed",
                    "heldout_kl_fused", "traces_heldout_recovered_share"))
    return card
