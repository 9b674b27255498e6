"""The `asymagent train-drafter` configuration: `TrainConfig` (every knob once, its flag generated) and the lr schedule.

Both objectives read it: `distill` (training/distill.py) and `fusion` (training/fusion_train.py).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path


FUSION_GROUP = "fusion objective (--objective fusion, training/fusion_train.py)"
FEATURE_GROUP = "feature head (--kind feature, training/feature_train.py)"


def knob(default, help: str | None = None, *, flag: bool = True, group: str | None = None,
         **argparse_kw):
    """A TrainConfig field and its `train-drafter` flag in one declaration: `--name-with-dashes`,
    typed by the default (a bool is a store_true switch, a list an appended option);
    `flag=False`: no command-line flag; `argparse_kw` (choices, required, metavar) go to argparse."""
    meta = {"help": help, "flag": flag, "group": group, "argparse": argparse_kw}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The train-drafter flags, generated from TrainConfig's fields (one declaration per knob)."""
    groups: dict = {}
    for f in fields(TrainConfig):
        meta = f.metadata
        if not meta.get("flag", False):
            continue
        target = p
        if meta["group"]:
            target = groups.setdefault(meta["group"], p.add_argument_group(meta["group"]))
        kw = {"help": meta["help"], **meta["argparse"]}
        name = "--" + f.name.replace("_", "-")
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        if isinstance(default, bool):
            target.add_argument(name, action="store_true", **kw)
        elif isinstance(default, list):
            target.add_argument(name, action="append", default=default, **kw)
        else:
            if "required" not in kw:
                kw["default"] = default
            if not isinstance(default, str):
                kw["type"] = type(default)
            target.add_argument(name, **kw)


@dataclass
class TrainConfig:
    """Every knob of `asymagent train-drafter`; each field is also its flag (`knob`)."""

    verifier: str = knob("default", "'default' (embedded SmolLM2), a dir, a .gguf or a cached HF id")
    layers: int = knob(2, "drafter decoder layers (1-2)")
    draft_vocab: int = knob(6000, "size N of the reduced draft vocabulary")
    max_minutes: float = knob(80.0, "wall-clock budget (final checkpoint when up)")
    max_steps: int = knob(0, "stop after this many steps (0: time budget only)")
    out: str = knob("runs/drafter", "output dir: checkpoints, drafter.safetensors, card", required=True)
    seed: int = knob(0)
    init: str = knob("verifier", "start the layers as copies of the verifier's first ones, or at random",
                     choices=["verifier", "random"])
    init_from: str = knob("", "warm start: a drafter .safetensors (or 'default', the shipped one) whose "
                              "layers replace --init; the card records the earlier run")
    lr: float = knob(4e-4)
    seq_len: int = knob(768)
    batch_size: int = knob(2)
    data_mix: str = knob("agent:0.6,self:0.15,text:0.25")
    ce_weight: float = knob(0.1, "weight of next-token CE added to the KL")
    self_turns: int = knob(240, "verifier-generated assistant turns to make")
    self_minutes: float = knob(6.0, "time cap for generating them")
    self_max_new: int = knob(48)
    checkpoint_minutes: float = knob(10.0)
    eval_every: int = knob(40, "held-out agreement every N steps (0: off)")
    threads: int = knob(2, "torch threads (1 is faster on a contended machine)")
    heldout_episodes: int = knob(3, "held-out episodes for agreement checks")
    resume: bool = knob(False, "continue from OUT/checkpoint.pt")
    install: bool = knob(False, "also copy the result into asymagent/assets/ as the default drafter "
                                "(embedded verifier only)")
    no_progress: bool = knob(False)
    warmup_steps: int = knob(20, flag=False)
    # positions per loss chunk: [512, V] fp32 logits = 100 MB at V=49k
    loss_chunk: int = knob(512, flag=False)
    objective: str = knob("distill", "distill: KL to the verifier on a token stream; fusion: make "
                                     "delta-fusion reproduce the full-context verifier on long agent "
                                     "conversations (+ draft KL)",
                          group=FUSION_GROUP, choices=("distill", "fusion"))
    conversations: int = knob(360, "long-context synthetic episodes per epoch (cycled over the "
                                   "training domains)", group=FUSION_GROUP)
    traces: list = knob([], "agent traces to mix in: a JSONL file or a capture directory "
                            "(asymagent/traces.py format; repeatable); traces of another "
                            "tokenizer/verifier are refused", group=FUSION_GROUP,
                        metavar="FILE_OR_DIR")
    traces_weight: float = knob(0.3, "share of trace conversations per epoch", group=FUSION_GROUP)
    traces_holdout: float = knob(0.2, "share of trace conversations kept out of training and "
                                      "measured (split by a hash of each conversation; `asymagent "
                                      "tune` measures on the same slice)", group=FUSION_GROUP)
    fusion_beta: float = knob(1.0, "beta of the fused target being trained", group=FUSION_GROUP)
    draft_weight: float = knob(0.5, "weight of KL(v_f || drafter) (drafting)", group=FUSION_GROUP)
    teacher_topk: int = knob(64, "top-k of v_f and of v_c cached per position", group=FUSION_GROUP)
    teacher_cache: str = knob("", "teacher rows directory (default OUT/teacher)", group=FUSION_GROUP)
    max_context: int = knob(6144, "full-view tokens read per conversation", group=FUSION_GROUP)
    compression: str = knob("", "CompressionConfig file for the compressed view (default: the "
                                "engine's)", group=FUSION_GROUP)

    kind: str = knob("model", "model: a drafter model (--objective distill|fusion); feature: an "
                              "EAGLE-3 feature head on the verifier's own features",
                     group=FEATURE_GROUP, choices=("model", "feature"))
    budget_min: float = knob(0.0, "wall-clock budget of the whole run in minutes, teacher forwards "
                                  "included (0: --max-minutes)", group=FEATURE_GROUP)
    teacher_share: float = knob(0.4, "most of the budget the teacher forwards may take", group=FEATURE_GROUP)
    feature_tokens: int = knob(120000, "teacher tokens to collect (features + top-k targets)",
                               group=FEATURE_GROUP)
    feature_context: int = knob(6144, "teacher tokens read per trace conversation (its first ones: "
                                      "a whole agent episode in one teacher forward, the features "
                                      "of a long history as the engine reads them)", group=FEATURE_GROUP)
    feature_vocab: int = knob(32768, "draft vocabulary of the head (its LM head rows; 0: the full "
                                     "vocabulary)", group=FEATURE_GROUP)
    feature_topk: int = knob(8, "top-k of the verifier's distribution kept as the target", group=FEATURE_GROUP)
    feature_intermediate: int = knob(0, "MLP width of the head's layer (0: the verifier's)", group=FEATURE_GROUP)
    ttt_steps: int = knob(3, "training-time test: chain steps fed the head's own outputs", group=FEATURE_GROUP)

    def validate(self) -> None:
        if self.kind == "feature":
            if self.ttt_steps < 1 or self.feature_topk < 1 or self.feature_tokens < 16:
                raise ValueError("--ttt-steps and --feature-topk must be >= 1, --feature-tokens >= 16")
            if self.feature_context < 16:
                raise ValueError("--feature-context must be >= 16")
            if self.budget_min < 0 or not 0.0 < self.teacher_share < 1.0:
                raise ValueError("--budget-min must be >= 0 and --teacher-share in (0, 1)")
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
