"""`asymagent train-drafter`: distil a 1-2 layer drafter from a verifier (KL over the full vocab).

Recipe: the drafter's layers start as copies of the verifier's first layers; embeddings and the
(tied) head are the verifier's own, frozen. Each step teacher-forces a batch of packed rows
(`training_data.TokenStream`), computes the verifier's logits on the fly (no grad) and minimises
KL(verifier || drafter) over the full vocabulary plus `--ce-weight` x next-token CE. The loss is
computed in position chunks on a detached copy of the drafter's last hidden state, so the
[B*T, V] logits never exist all at once. The run is time-budgeted (`--max-minutes`: it saves a
final checkpoint when time is up), seeded, checkpointed every `--checkpoint-minutes` and
resumable (`--resume`). The draft vocabulary is the `--draft-vocab` ids the verifier predicted
most often (its argmax) over the training rows.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from asymagent.modeling.drafter import install_default  # noqa: F401  (re-exported)
from asymagent.training.config import TrainConfig, add_arguments, lr_at  # noqa: F401  (the verb's flags)
from asymagent.training.trainer import Trainer


def distill_step(verifier, drafter, ids, ce_weight: float, chunk: int):
    """One teacher-forced KL(+CE) forward/backward on ids [B, T]; returns (loss, agree, argmax ids).

    Gradients land on the drafter's layers/norm; the verifier and shared head stay frozen.
    """
    import torch
    import torch.nn.functional as F

    B, T = ids.shape
    with torch.no_grad():
        t_hidden = verifier.model(input_ids=ids).last_hidden_state.reshape(B * T, -1)  # [B*T, H]
    hidden = drafter.model(input_ids=ids).last_hidden_state  # [B, T, H]
    h = hidden.detach().reshape(B * T, -1).requires_grad_()  # [B*T, H]
    targets = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], 1).reshape(-1)  # [B*T]
    n = B * T
    total, agree, t_argmax = 0.0, 0, []
    for s in range(0, n, chunk):
        with torch.no_grad():
            t_logp = F.log_softmax(verifier.lm_head(t_hidden[s:s + chunk]).float(), -1)  # [c, V]
        s_logp = F.log_softmax(drafter.lm_head(h[s:s + chunk]).float(), -1)  # [c, V]
        kl = (t_logp.exp() * (t_logp - s_logp)).sum(-1).sum()
        ce = F.nll_loss(s_logp, targets[s:s + chunk], ignore_index=-100, reduction="sum")
        loss = (kl + ce_weight * ce) / n
        loss.backward()
        total += loss.item()
        ta = t_logp.argmax(-1)
        agree += int((ta == s_logp.argmax(-1)).sum())
        t_argmax.append(ta)
    hidden.backward(h.grad.reshape(B, T, -1))
    return total, agree / n, torch.cat(t_argmax)


def mean_kl(verifier, drafter, ids) -> float:
    """Mean per-position KL(verifier || drafter) over the full vocabulary on ids [B, T] (no grad)."""
    import torch
    import torch.nn.functional as F

    with torch.no_grad():
        t = F.log_softmax(verifier(input_ids=ids).logits.float(), -1)  # [B, T, V]
        s = F.log_softmax(drafter(input_ids=ids).logits.float(), -1)  # [B, T, V]
        return float((t.exp() * (t - s)).sum(-1).mean())


def heldout_metrics(verifier, drafter, seqs, draft_vocab=None, sizes=(2000, 4000, 6000, 8000, 12000),
                    ranking=None) -> dict:
    """Teacher-forced greedy top-1 agreement on held-out sequences (full and draft vocab)."""
    import torch

    agree_full = agree_draft = total = 0
    covered = {n: 0 for n in sizes}
    rank_of = None
    if ranking is not None:
        rank_of = torch.full((verifier.config.vocab_size,), len(ranking) + 1, dtype=torch.long)
        rank_of[ranking] = torch.arange(len(ranking))
    with torch.no_grad():
        for seq in seqs:
            ids = torch.tensor([seq])
            t = verifier(input_ids=ids).logits[0].argmax(-1)  # [T]
            hidden = drafter.model(input_ids=ids).last_hidden_state[0]  # [T, H]
            logits = drafter.lm_head(hidden)  # [T, V]
            agree_full += int((logits.argmax(-1) == t).sum())
            if draft_vocab is not None:
                sub = logits[:, draft_vocab].argmax(-1)  # [T] indices into draft_vocab
                agree_draft += int((draft_vocab[sub] == t).sum())
            if rank_of is not None:
                for n_ in sizes:
                    covered[n_] += int((rank_of[t] < n_).sum())
            total += len(seq)
    out = {"heldout_tokens": total, "heldout_top1_agreement_full_vocab": agree_full / max(total, 1)}
    if draft_vocab is not None:
        out["heldout_top1_agreement_draft_vocab"] = agree_draft / max(total, 1)
    if rank_of is not None:
        out["draft_vocab_coverage_of_verifier_argmax"] = {str(k): v / max(total, 1) for k, v in covered.items()}
    return out


def vocab_ranking(argmax_counts, token_counts):
    """Token ids, best first: by how often the verifier predicted them (its argmax), ties broken
    by corpus frequency. The first N are the FR-Spec draft vocabulary."""
    import torch

    V = len(argmax_counts)
    score = argmax_counts.double() * (V + 1) + token_counts.double() / max(1, int(token_counts.max())) * V
    return torch.argsort(score, descending=True)


def drafter_from_checkpoint(checkpoint, verifier, draft_vocab: int):
    """A drafter (with `asymagent_draft_vocab`) from OUT/checkpoint.pt, e.g. of a running job."""
    import torch

    from asymagent.modeling.drafter import build_drafter

    state = torch.load(checkpoint, weights_only=False)
    layers = len({k.split(".")[2] for k in state["drafter"] if k.startswith("model.layers.")})
    drafter = build_drafter(verifier, layers, init_from_verifier=False)
    drafter.load_state_dict(state["drafter"], strict=False)
    ranking = vocab_ranking(state["argmax_counts"], state["token_counts"])
    drafter.asymagent_draft_vocab = torch.sort(ranking[:draft_vocab]).values
    drafter.asymagent_card = {"steps": state["step"], "elapsed_s": state["elapsed_s"]}
    return drafter.eval()


def warm_start_layers(drafter, verifier, source: str) -> dict:
    """Copy a trained drafter's layers and norm into `drafter`; returns a summary of its card.

    `source` is a drafter .safetensors or 'default' (the shipped asset). The layer count must
    match; the draft vocabulary is re-ranked from this run's counts as usual.
    """
    import torch

    from asymagent.modeling.drafter import DEFAULT_DRAFTER_FILE, load_drafter, trainable_state_dict

    path = DEFAULT_DRAFTER_FILE if source == "default" else Path(source)
    earlier = load_drafter(path, verifier)
    theirs, ours = trainable_state_dict(earlier), trainable_state_dict(drafter)
    if set(theirs) != set(ours):
        raise ValueError(f"--init-from {path}: {len(theirs)} drafter tensors do not match this run's "
                         f"{len(ours)} (check --layers)")
    with torch.no_grad():
        drafter.load_state_dict({k: v.to(ours[k].dtype) for k, v in theirs.items()}, strict=False)
    card = earlier.asymagent_card or {}
    keep = ("steps", "train_tokens", "wall_minutes", "data_mix", "self_turns", "heldout_top1_agreement_full_vocab")
    return {"file": path.name, **{k: card[k] for k in keep if k in card},
            **({"warm_start": card["warm_start"]} if "warm_start" in card else {})}


class DistillObjective:
    """KL(verifier || drafter) over the full vocabulary on a token stream (module docstring);
    counts the verifier's argmax per token id for the draft vocabulary."""

    desc, unit = "distil", "tok"

    def __init__(self, trainer: Trainer, state: dict | None) -> None:
        import torch

        from asymagent.training.data import TokenStream, heldout_episodes, parse_mix

        cfg = trainer.cfg
        self.cfg = cfg
        self.vocab = trainer.verifier.config.vocab_size
        self.argmax_counts = torch.zeros(self.vocab, dtype=torch.long)
        self.token_counts = torch.zeros(self.vocab, dtype=torch.long)
        if state is not None:
            self.argmax_counts, self.token_counts = state["argmax_counts"], state["token_counts"]
        trainer.restore_rng(state)
        self.mix = parse_mix(cfg.data_mix)
        self.self_turns = self._self_turns(trainer)
        self.stream = TokenStream(trainer.tokenizer, cfg.seq_len, self.mix, seed=cfg.seed,
                                  self_turns=self.self_turns)
        self.heldout = [s[:cfg.seq_len] for s in heldout_episodes(trainer.tokenizer, cfg.heldout_episodes,
                                                                  seed=cfg.seed + 99)]
        self.run_tokens = 0
        self.reserve_s = self._closing_cost(trainer)

    def _closing_cost(self, trainer: Trainer) -> float:
        """Seconds the closing evaluation will take (kept free of training, `Trainer.fit`): five
        full-vocabulary passes over the held-out episodes (held-out metrics and the verdict:
        the verifier twice, the trained drafter twice, the untrained layers:N once), timed on
        the verifier over the first episode."""
        import torch

        if not self.heldout:
            return 0.0
        t = time.monotonic()
        with torch.no_grad():
            trainer.verifier(input_ids=torch.tensor([self.heldout[0]]))
        return 5 * (time.monotonic() - t) * len(self.heldout)

    def _self_turns(self, trainer: Trainer) -> list:
        """Verifier-generated assistant turns (made once, kept in OUT/self_turns.jsonl)."""
        from asymagent.training.data import (generate_self_turns, load_token_lists, save_token_lists,
                                             self_gen_prompts)

        cfg = self.cfg
        self_file = trainer.out / "self_turns.jsonl"
        turns: list[list[int]] = []
        if self.mix.get("self", 0) > 0 and cfg.self_turns > 0:
            if self_file.is_file():
                turns = load_token_lists(self_file)
            else:
                prompts = self_gen_prompts(trainer.tokenizer, cfg.self_turns, cfg.seed,
                                           max_prompt_tokens=min(cfg.seq_len, 512))
                deadline = time.monotonic() + min(cfg.self_minutes * 60,
                                                  max(0.0, trainer.budget_s - trainer.elapsed()) / 3)
                turns = generate_self_turns(trainer.verifier, trainer.tokenizer, prompts, cfg.self_max_new,
                                            deadline=deadline, progress=not cfg.no_progress)
                save_token_lists(self_file, turns)
            trainer.log(f"verifier turns: {len(turns)}")
        return turns

    def step(self, trainer: Trainer, step: int, progress: float) -> tuple:
        import torch

        ids = self.stream.batch(step, self.cfg.batch_size)  # [B, T]
        loss, agree, t_argmax = distill_step(trainer.verifier, trainer.drafter, ids, self.cfg.ce_weight,
                                             self.cfg.loss_chunk)
        self.argmax_counts += torch.bincount(t_argmax, minlength=self.vocab)
        self.token_counts += torch.bincount(ids.reshape(-1), minlength=self.vocab)
        self.run_tokens += ids.numel()
        return ({"loss": round(loss, 5), "agree": round(agree, 4)},
                {"loss": f"{loss:.3f}", "agree": f"{agree:.3f}"}, ids.numel())

    def evaluate(self, trainer: Trainer) -> dict:
        from asymagent.training.domains import HELD_OUT_DOMAIN

        m = heldout_metrics(trainer.verifier, trainer.drafter, self.heldout)
        trainer.log(f"\nstep {trainer.step}: held-out ({HELD_OUT_DOMAIN}) agreement "
                    f"{m['heldout_top1_agreement_full_vocab']:.3f}")
        return {"heldout_agree": round(m["heldout_top1_agreement_full_vocab"], 4)}

    def checkpoint_state(self) -> dict:
        return {"argmax_counts": self.argmax_counts, "token_counts": self.token_counts}


def run(cfg: TrainConfig, loaded=None) -> dict:
    """Train (or resume) and export OUT/drafter.safetensors + card; returns the card dict.

    `loaded` (a `models.LoadedModel`) overrides `cfg.verifier` (tests pass a tiny model).
    """
    import torch

    from asymagent.modeling.drafter import build_drafter
    from asymagent.spec_config import SpecConfig
    from asymagent.training.domains import HELD_OUT_DOMAIN, TRAIN_DOMAINS
    from asymagent.training.verdict import judge

    trainer = Trainer(cfg, loaded, python_seed=True)
    drafter = build_drafter(trainer.verifier, cfg.layers, init_from_verifier=cfg.init == "verifier")
    warm_start = None
    if cfg.init_from and not cfg.resume:
        warm_start = warm_start_layers(drafter, trainer.verifier, cfg.init_from)
        trainer.log(f"warm start from {cfg.init_from} ({warm_start.get('steps')} earlier steps)")
    trainer.train_drafter(drafter)
    objective = DistillObjective(trainer, trainer.resume())
    trainer.fit(objective)

    V, history = objective.vocab, trainer.history
    ranking = vocab_ranking(objective.argmax_counts, objective.token_counts)
    draft_vocab = torch.sort(ranking[:min(cfg.draft_vocab, V)]).values
    drafter.eval()
    metrics = heldout_metrics(trainer.verifier, drafter, objective.heldout, draft_vocab=draft_vocab,
                              ranking=ranking)
    verdict = judge(trainer.verifier, drafter, objective.heldout, cfg.layers, SpecConfig().k)
    wall = trainer.elapsed()
    total_tokens = sum(1 for _ in history) * cfg.batch_size * cfg.seq_len
    card = {
        **trainer.card_head(),
        "layers": cfg.layers, "draft_vocab_size": int(len(draft_vocab)),
        "data_mix": objective.mix, "train_domains": [d.name for d in TRAIN_DOMAINS],
        "heldout_domain": HELD_OUT_DOMAIN,
        "self_turns": len(objective.self_turns), "steps": trainer.step, "train_tokens": total_tokens,
        "wall_minutes": round(wall / 60, 2),
        "tokens_per_s_this_run": round(objective.run_tokens / max(1e-9, time.monotonic() - trainer.t0), 1),
        "config": trainer.card_config(),
        **({"warm_start": warm_start} if warm_start else {}),
        "final_loss_mean_last_20": round(sum(h["loss"] for h in history[-20:]) / max(1, len(history[-20:])), 4),
        **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in metrics.items()},
        **verdict.as_card(), "verdict": verdict.line(),
    }
    trainer.export(draft_vocab, card, ("steps", "train_tokens", "wall_minutes",
                                       "heldout_top1_agreement_full_vocab",
                                       "heldout_top1_agreement_draft_vocab"))
    budget = f"budget {cfg.max_minutes:g} min" if cfg.max_minutes > 0 else f"--max-steps {cfg.max_steps}"
    print(f"train-drafter: {trainer.step} steps in {wall / 60:.1f} min ({budget}). {verdict.line()}",
          flush=True)  # the closing line, also under --no-progress
    return card


def config_from_args(args) -> TrainConfig:
    fields = TrainConfig.__dataclass_fields__
    return TrainConfig(**{k: v for k, v in vars(args).items() if k in fields})


def check_args(args) -> None:
    """Refuse mistakes before any model loads (`asymagent` prints them on one line, exit 2)."""
    from asymagent.modeling.loading import check_model_source
    from asymagent.training.data import parse_mix

    cfg = config_from_args(args)
    cfg.validate()
    parse_mix(cfg.data_mix)
    if cfg.kind == "feature":  # a feature head may name a pair's verifier ("pair:NAME")
        from asymagent.modeling.pairs import check_model_source as check_pair_source

        check_pair_source(cfg.verifier)
    else:
        check_model_source(cfg.verifier)
    if cfg.init_from and not Path(cfg.init_from).expanduser().exists():
        raise FileNotFoundError(f"--init-from: no such file: {cfg.init_from}")
    missing = [t for t in cfg.traces if not Path(t).expanduser().exists()]
    if missing:
        raise FileNotFoundError(f"--traces: no such file or directory: {missing[0]}")
    if cfg.traces:
        from asymagent.traces import load_traces

        for path in cfg.traces:  # a bad line is a mistake too: found before any model loads
            load_traces(Path(path).expanduser())
    if Path(cfg.out).expanduser().is_file():
        raise ValueError(f"--out {cfg.out} is a file; it must be a directory (created if missing)")


def main(args) -> int:
    cfg = config_from_args(args)
    if cfg.kind == "feature":  # an EAGLE-3 feature head (training/feature_train.py)
        from asymagent.training import feature_train

        feature_train.run(cfg)
    elif cfg.objective == "fusion":
        from asymagent.training import fusion_train
        from asymagent.traces import TraceMismatchError

        try:
            fusion_train.run(cfg)
        except TraceMismatchError as exc:  # known once the verifier is loaded: one line, exit 2
            print(f"asymagent train-drafter: error: {exc}", file=sys.stderr)
            return 2
    else:
        run(cfg)
    return 0


if __name__ == "__main__":  # python -m asymagent.training.distill (same flags as the CLI verb)
    _parser = argparse.ArgumentParser(prog="asymagent train-drafter", description=__doc__.splitlines()[0])
    add_arguments(_parser)
    raise SystemExit(main(_parser.parse_args()))
