"""The trainer skeleton both train-drafter objectives share: run setup, the step loop, checkpoint, export.

`Trainer` owns what `distill` (training/distill.py) and `fusion` (training/fusion_train.py)
have in common: threads and seeds, the output directory, the frozen verifier, the drafter's
trainable parameters and AdamW, resuming from OUT/checkpoint.pt, the wall-clock / step budget
and the lr schedule, the loop (lr, zero_grad, the objective's loss and backward, clip, step,
history, progress bar, held-out checks every `--eval-every` steps, a checkpoint every
`--checkpoint-minutes`), and the export (drafter.safetensors + card, `--install`,
history.json). An objective supplies the rest through `Objective`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Protocol

import torch

from asymagent.training.config import TrainConfig, lr_at


class Objective(Protocol):
    """What one training objective adds to the skeleton."""

    desc: str  # progress bar label
    unit: str  # progress bar unit

    def step(self, trainer: "Trainer", step: int, progress: float) -> tuple | None:
        """Compute the loss of step `step` and call backward: (history record, postfix,
        bar units), or None when there is nothing to train on this step (it still counts)."""

    def evaluate(self, trainer: "Trainer") -> dict:
        """Held-out figures merged into the last history record."""

    def checkpoint_state(self) -> dict:
        """The objective's own checkpoint entries."""


class Trainer:
    """One train-drafter run (see module docstring)."""

    def __init__(self, cfg: TrainConfig, loaded=None, *, python_seed: bool = False) -> None:
        """Validate `cfg`, set threads and seeds, make OUT, load and freeze the verifier
        (`loaded`, a `LoadedModel`, overrides `cfg.verifier`: tests pass a tiny model)."""
        from asymagent.modeling.loading import load_model

        cfg.validate()
        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        if python_seed:
            import random

            random.seed(cfg.seed)
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.ckpt_path = self.out / "checkpoint.pt"
        self.log: Callable = (lambda *a: None) if cfg.no_progress else \
            (lambda *a: print(*a, flush=True))
        self.t0 = time.monotonic()
        self.loaded = loaded if loaded is not None else load_model(cfg.verifier)
        self.verifier, self.tokenizer = self.loaded.model, self.loaded.tokenizer
        self.verifier.eval()
        for p in self.verifier.parameters():
            p.requires_grad_(False)
        self.drafter = self.params = self.opt = None
        self.step, self.prev_elapsed, self.history = 0, 0.0, []
        self.budget_s = cfg.max_minutes * 60 if cfg.max_minutes > 0 else float("inf")

    def train_drafter(self, drafter) -> None:
        """Make `drafter`'s trainable parameters trainable and build the optimizer."""
        from asymagent.modeling.drafter import trainable_parameters

        self.drafter = drafter
        self.params = trainable_parameters(drafter)
        for p in self.params:
            p.requires_grad_(True)
        drafter.train()
        self.opt = torch.optim.AdamW(self.params, lr=self.cfg.lr, weight_decay=0.0,
                                     betas=(0.9, 0.98))

    def resume(self) -> dict | None:
        """With `--resume`: load OUT/checkpoint.pt into the drafter, optimizer, step, clock,
        history and torch RNG; returns the whole state (the objective reads its entries)."""
        if not self.cfg.resume:
            return None
        if not self.ckpt_path.is_file():
            raise FileNotFoundError(f"--resume given but {self.ckpt_path} does not exist")
        state = torch.load(self.ckpt_path, weights_only=False)
        self.drafter.load_state_dict(state["drafter"], strict=False)
        self.opt.load_state_dict(state["optimizer"])
        self.step, self.prev_elapsed = state["step"], state["elapsed_s"]
        self.history = state["history"]
        return state

    def restore_rng(self, state: dict | None) -> None:
        """The torch RNG as the checkpoint left it (after the objective read its entries)."""
        if state is not None:
            torch.set_rng_state(state["torch_rng"])
            self.log(f"resumed at step {self.step} ({self.prev_elapsed / 60:.1f} min done)")

    def elapsed(self) -> float:
        """Seconds of training over every run of this output directory."""
        return self.prev_elapsed + time.monotonic() - self.t0

    def progress(self) -> float:
        """Share of the budget spent: the time budget or `--max-steps`, whichever is nearer."""
        cfg = self.cfg
        return max(self.elapsed() / self.budget_s, self.step / cfg.max_steps if cfg.max_steps else 0.0)

    def save_checkpoint(self, objective: Objective) -> None:
        """OUT/checkpoint.pt (written to .tmp first, then renamed)."""
        from asymagent.modeling.drafter import trainable_state_dict

        tmp = Path(str(self.ckpt_path) + ".tmp")
        torch.save({"drafter": trainable_state_dict(self.drafter), "optimizer": self.opt.state_dict(),
                    "step": self.step, "elapsed_s": self.elapsed(), "history": self.history,
                    **objective.checkpoint_state(), "torch_rng": torch.get_rng_state(),
                    "config": asdict(self.cfg)}, str(tmp))
        tmp.replace(self.ckpt_path)

    def fit(self, objective: Objective) -> None:
        """The step loop until the budget is spent, then a final checkpoint.

        `--max-minutes` is wall clock from the start of the run (loading, data generation and
        the closing evaluation included): a step is not started when the last step's time plus
        the objective's `reserve_s` (its closing evaluation) would end past the budget."""
        from tqdm import tqdm

        cfg = self.cfg
        last_ckpt = time.monotonic()
        bar = tqdm(desc=objective.desc, unit=objective.unit, disable=cfg.no_progress,
                   mininterval=15)
        reserve, step_s = getattr(objective, "reserve_s", 0.0), 0.0
        while True:
            progress = self.progress()
            if progress >= 1.0 or self.elapsed() + step_s + reserve > self.budget_s:
                break
            started = time.monotonic()
            for g in self.opt.param_groups:
                g["lr"] = lr_at(cfg, self.step, progress)
            self.opt.zero_grad(set_to_none=True)
            out = objective.step(self, self.step, progress)
            self.step += 1
            if out is None:
                continue
            record, postfix, units = out
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            self.opt.step()
            self.history.append({"step": self.step, **record, "elapsed_s": round(self.elapsed(), 1)})
            bar.update(units)
            bar.set_postfix(step=self.step, **postfix)
            step_s = time.monotonic() - started
            if cfg.eval_every and self.step % cfg.eval_every == 0:
                self.drafter.eval()
                self.history[-1].update(objective.evaluate(self))
                self.drafter.train()
            if time.monotonic() - last_ckpt > cfg.checkpoint_minutes * 60:
                self.save_checkpoint(objective)
                last_ckpt = time.monotonic()
        bar.close()
        self.save_checkpoint(objective)

    def card_head(self) -> dict:
        """The card fields every drafter carries first: format and the verifier it was made for."""
        from asymagent.modeling.loading import EMBEDDED_VERIFIER_ID

        return {"format": "asymagent-drafter-1",
                "verifier": self.loaded.source if self.cfg.verifier != "default" else EMBEDDED_VERIFIER_ID,
                "verifier_sha256": self.loaded.fingerprint}

    def card_config(self) -> dict:
        """The run's settings as the card records them (not resume, no_progress, out)."""
        return {k: v for k, v in asdict(self.cfg).items() if k not in ("resume", "no_progress", "out")}

    def export(self, draft_vocab: torch.Tensor, card: dict, summary: tuple) -> None:
        """OUT/drafter.safetensors with `card`, `--install`, OUT/history.json; logs `summary`
        (the card keys printed on the last line)."""
        from asymagent.modeling.drafter import install_default, save_drafter

        save_drafter(self.drafter, self.out / "drafter.safetensors", draft_vocab, card)
        if self.cfg.install:
            install_default(self.out / "drafter.safetensors")
        (self.out / "history.json").write_text(json.dumps(self.history))
        self.log(json.dumps({k: card.get(k) for k in summary if k in card}))
