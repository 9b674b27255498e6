"""The `asymagent train-drafter` configuration: its flags, `TrainConfig` (defaults explained) and the lr schedule.

Both objectives read it: `distill` (training/distill.py) and `fusion` (training/fusion_train.py).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verifier", default="default", help="'default' (embedded SmolLM2), a dir, a .gguf or a cached HF id")
    p.add_argument("--layers", type=int, default=2, help="drafter decoder layers (1-2)")
    p.add_argument("--draft-vocab", type=int, default=6000, help="size N of the reduced draft vocabulary")
    p.add_argument("--max-minutes", type=float, default=80.0, help="wall-clock budget (final checkpoint when up)")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: time budget only)")
    p.add_argument("--out", required=True, help="output dir: checkpoints, drafter.safetensors, card")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--init", choices=["verifier", "random"], default="verifier",
                   help="start the layers as copies of the verifier's first ones, or at random")
    p.add_argument("--init-from", default="",
                   help="warm start: a drafter .safetensors (or 'default', the shipped one) whose layers "
                        "replace --init; the card records the earlier run")
    p.add_argument("--lr", type=float, default=4e-4)
    p.add_argument("--seq-len", type=int, default=768)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--data-mix", default="agent:0.6,self:0.15,text:0.25")
    p.add_argument("--ce-weight", type=float, default=0.1, help="weight of next-token CE added to the KL")
    p.add_argument("--self-turns", type=int, default=240, help="verifier-generated assistant turns to make")
    p.add_argument("--self-minutes", type=float, default=6.0, help="time cap for generating them")
    p.add_argument("--self-max-new", type=int, default=48)
    p.add_argument("--checkpoint-minutes", type=float, default=10.0)
    p.add_argument("--eval-every", type=int, default=40, help="held-out agreement every N steps (0: off)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (1 is faster on a contended machine)")
    p.add_argument("--heldout-episodes", type=int, default=3, help="held-out episodes for agreement checks")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--install", action="store_true",
                   help="also copy the result into asymagent/assets/ as the default drafter (embedded verifier only)")
    p.add_argument("--no-progress", action="store_true")
    f = p.add_argument_group("fusion objective (--objective fusion, training/fusion_train.py)")
    f.add_argument("--objective", choices=("distill", "fusion"), default="distill",
                   help="distill: KL to the verifier on a token stream; fusion: make delta-fusion reproduce "
                        "the full-context verifier on long agent conversations (+ draft KL)")
    f.add_argument("--conversations", type=int, default=360,
                   help="long-context synthetic episodes per epoch (cycled over the training domains)")
    f.add_argument("--traces", action="append", default=[], metavar="FILE_OR_DIR",
                   help="agent traces to mix in: a JSONL file or a capture directory (asymagent/traces.py "
                        "format; repeatable); traces of another tokenizer/verifier are refused")
    f.add_argument("--traces-weight", type=float, default=0.3, help="share of trace conversations per epoch")
    f.add_argument("--traces-holdout", type=float, default=0.2,
                   help="share of trace conversations kept out of training and measured (split by a hash "
                        "of each conversation; `asymagent tune` measures on the same slice)")
    f.add_argument("--fusion-beta", type=float, default=1.0, help="beta of the fused target being trained")
    f.add_argument("--draft-weight", type=float, default=0.5, help="weight of KL(v_f || drafter) (drafting)")
    f.add_argument("--teacher-topk", type=int, default=64, help="top-k of v_f and of v_c cached per position")
    f.add_argument("--teacher-cache", default="", help="teacher rows directory (default OUT/teacher)")
    f.add_argument("--max-context", type=int, default=6144, help="full-view tokens read per conversation")
    f.add_argument("--compression", default="", help="CompressionConfig file for the compressed view (default: the engine's)")


@dataclass
class TrainConfig:
    verifier: str = "default"
    layers: int = 2
    draft_vocab: int = 6000
    max_minutes: float = 80.0
    max_steps: int = 0
    out: str = "runs/drafter"
    seed: int = 0
    init: str = "verifier"
    init_from: str = ""
    lr: float = 4e-4
    seq_len: int = 768
    batch_size: int = 2
    data_mix: str = "agent:0.6,self:0.15,text:0.25"
    ce_weight: float = 0.1
    self_turns: int = 240
    self_minutes: float = 6.0
    self_max_new: int = 48
    checkpoint_minutes: float = 10.0
    eval_every: int = 40
    threads: int = 2
    heldout_episodes: int = 3
    resume: bool = False
    install: bool = False
    no_progress: bool = False
    warmup_steps: int = 20
    loss_chunk: int = 512  # positions per loss chunk: [512, V] fp32 logits = 100 MB at V=49k
    objective: str = "distill"  # "fusion": training/fusion_train.py
    conversations: int = 360
    traces: list = field(default_factory=list)
    traces_weight: float = 0.3
    traces_holdout: float = 0.2
    fusion_beta: float = 1.0
    draft_weight: float = 0.5
    teacher_topk: int = 64
    teacher_cache: str = ""
    max_context: int = 6144
    compression: str = ""

    def validate(self) -> None:
        if self.layers < 1:
            raise ValueError(f"--layers must be >= 1, got {self.layers}")
        if self.draft_vocab < 1:
            raise ValueError(f"--draft-vocab must be >= 1, got {self.draft_vocab}")
        if self.max_minutes <= 0 and self.max_steps <= 0:
            raise ValueError("give --max-minutes > 0 or --max-steps > 0")
        if self.lr <= 0 or self.batch_size < 1:
            raise ValueError("--lr must be > 0 and --batch-size >= 1")
        if self.objective not in ("distill", "fusion"):
            raise ValueError(f"--objective must be distill or fusion, got {self.objective!r}")
        if self.objective == "fusion":
            if self.conversations < 1 and not self.traces:
                raise ValueError("--objective fusion needs --conversations >= 1 or --traces")
            if not 0.0 <= self.traces_weight <= 1.0 or self.fusion_beta < 0 or self.draft_weight < 0:
                raise ValueError("--traces-weight must be in [0, 1]; --fusion-beta and --draft-weight >= 0")
            if self.teacher_topk < 1 or self.max_context < 16:
                raise ValueError("--teacher-topk must be >= 1 and --max-context >= 16")
            if not 0.0 <= self.traces_holdout < 1.0:
                raise ValueError(f"--traces-holdout must be in [0, 1), got {self.traces_holdout}")
            for path in self.traces:
                if not Path(path).exists():
                    raise ValueError(f"--traces {path}: no such file or directory")


def lr_at(cfg: TrainConfig, step: int, progress: float) -> float:
    """Linear warmup, then cosine from lr to lr/10 over the run's progress (time or steps)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))
