"""`asymagent eval fusion`: how much of the full context delta-fusion gives back, token by token.

    asymagent eval fusion --split test --episodes 3 --json fusion.json --report runs/fusion
    python -m asymagent.evals.running.fusion --suites records,domain:parcels --episodes 2 --variants beta=0.5,beta=2

At every response position of held-out agent conversations (teacher-forced along mode full's own
greedy output, prompts rendered exactly as `Engine.chat` renders them, compressed view from the
engine's compressors) four distributions are read:
- v_f: the verifier on the full view (what asym should reproduce),
- v_c: the verifier on the compressed view (what mode compressed decodes from),
- a, b: the drafter on the full and on the compressed view,
and fused = log_softmax(log v_c + beta (log a - log b)) for each variant. Reported per suite,
overall and per token class: KL(v_f || v_c), KL(v_f || fused), the recovered share
1 - sum KL(v_f||fused) / sum KL(v_f||v_c) (1: fusion gives back everything compression took; 0:
nothing; < 0: it moves away from v_f), top-1 agreement with v_f of compressed and fused, positions
fused fixes / breaks, and the drafter's JSD between its views. A bootstrap over conversations
(episodes) gives the recovered share an interval.

Token classes (walking the response through the tool-call grammar, as the engine would under
tool_choice="required"): `grammar` (the constraint alone determines the token: JSON scaffolding,
the end of the call), `argument` (any other token of a valid tool call: names and argument
values), `text` (a response that is not a valid tool call). Suites: records, fs_audit, tickets,
injection (evals/) and `domain:NAME` (training/long_episodes.py over a synthetic domain;
`parcels` is never trained on).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field

DEFAULT_SUITES = "records,fs_audit,tickets,injection,domain:parcels"
CLASSES = ("grammar", "argument", "text")


# --------------------------------------------------------------------------- variants
@dataclass(frozen=True)
class Variant:
    """How the delta is applied: fused = log v_c + beta_eff * (log a - log b) at each position.

    beta_eff = beta, times 0 where JSD(a||b) < jsd_min (delta only where the drafter's views
    disagree: the engine's divergence gate, SpecConfig.jsd_min), times min(1, JSD / jsd_scale)
    when jsd_scale > 0 (confidence-weighted beta; this harness only).
    copy > 0 adds copy x the copy delta (asymagent/decoding/copy_delta.py: continuations that only
    the full view's removed text holds).
    """

    beta: float = 1.0
    jsd_min: float = 0.0
    jsd_scale: float = 0.0
    copy: float = 0.0
    copy_min: float = 2  # shortest repeated suffix the copy delta counts from
    copy_unseen: float = 0  # 1: the copy delta's rule "unseen" (copy_delta.RULES), else "removed"

    @property
    def copy_key(self) -> tuple:
        """(min length, rule): which copy delta rows this variant adds."""
        return (int(self.copy_min), "unseen" if self.copy_unseen else "removed")

    @property
    def name(self) -> str:
        parts = [f"beta={self.beta:g}"]
        if self.jsd_min:
            parts.append(f"jsd_min={self.jsd_min:g}")
        if self.jsd_scale:
            parts.append(f"jsd_scale={self.jsd_scale:g}")
        if self.copy:
            parts.append(f"copy={self.copy:g}")
        if self.copy_min != 2:
            parts.append(f"copy_min={self.copy_min:g}")
        if self.copy_unseen:
            parts.append("copy_unseen=1")
        return ",".join(parts)

    @classmethod
    def parse(cls, spec: str) -> "Variant":
        """"beta=1,jsd_min=0.02" -> Variant; unknown keys are an error."""
        kw = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, sep, value = part.partition("=")
            if not sep or key not in ("beta", "jsd_min", "jsd_scale", "copy", "copy_min", "copy_unseen"):
                raise ValueError(f"bad variant part {part!r} in {spec!r}: expected beta=, jsd_min=, "
                                 "jsd_scale=, copy=, copy_min= or copy_unseen=")
            kw[key] = float(value)
        return cls(**kw)


def parse_variants(spec: str) -> list:
    """"beta=1;beta=0.5,jsd_min=0.01" -> [Variant, ...] (';' between variants)."""
    return [Variant.parse(s) for s in spec.split(";") if s.strip()]


def fused_logprobs(lc, la, lb, jsd, variant: Variant, copy_rows: dict | None = None):
    """log_softmax(lc + beta_eff * (la - lb) [+ copy * copy_rows]) over rows [T, V]; jsd [T].

    The engine's own functions: the divergence gate (`gated_beta`, SpecConfig.jsd_min) and the
    fused score (`fused_scores`: log-prob rows, so both log-sum-exps are 0); jsd_scale is an
    experiment of this harness only (not in the engine)."""
    import torch

    from asymagent.kernels.gate_reference import fused_scores, gated_beta

    beta = gated_beta(jsd, torch.full_like(jsd, variant.beta), variant.jsd_min)  # [T]
    if variant.jsd_scale:
        beta = beta * (jsd / variant.jsd_scale).clamp(max=1.0)
    zero = torch.zeros_like(jsd)[:, None]  # [T, 1] log-sum-exp of a log-prob row
    target = fused_scores(lc, la, lb, beta, zero, zero)  # [T, V]
    if variant.copy and copy_rows is not None:
        target = target + variant.copy * copy_rows[variant.copy_key]
    return torch.log_softmax(target, dim=-1)  # [T, V]


# --------------------------------------------------------------------------- conversations
@dataclass
class Conversation:
    suite: str
    seed: int
    messages: list  # the whole episode (OpenAI messages); steps cut it at assistant turns
    tools: list


def conversations(suite: str, seeds: list) -> list:
    """The episodes of `suite` (an eval suite or `domain:NAME`) for `seeds`."""
    out = []
    if suite.startswith("domain:"):
        from asymagent.training.domains import domain_by_name
        from asymagent.training.long_episodes import long_episode

        d = domain_by_name(suite.split(":", 1)[1])
        for seed in seeds:
            messages, tools = long_episode(d, seed)
            out.append(Conversation(suite, seed, messages, tools))
        return out
    from asymagent.evals.suites.environments import check_held_out, make_env, oracle_episode

    check_held_out(suite, seeds)
    for seed in seeds:
        task, history = oracle_episode(make_env(suite), seed)
        out.append(Conversation(suite, seed, history, task.tools))
    return out


# --------------------------------------------------------------------------- token classes
def token_classes(tokenizer, tools: list, response: list, vocab_size: int) -> list:
    """CLASSES label of each response token (see the module docstring)."""
    if not tools:
        return ["text"] * len(response)
    from asymagent.chat.tool_constraint import ToolCallConstraint

    try:
        c = ToolCallConstraint(tokenizer, tools, "required", vocab_size=vocab_size)
    except ValueError:
        return ["text"] * len(response)
    labels = []
    for t in response:
        if c.is_terminated():
            labels.append("grammar")  # past a complete call: the stop token, determined
            continue
        forced = c.forced_tokens()
        labels.append("grammar" if forced and int(forced[0]) == t else "argument")
        if not c.advance(t):
            return ["text"] * len(response)  # not a valid tool call
    return labels


# --------------------------------------------------------------------------- measuring
class _Reader:
    """One model on one view: prefix-reused cache, rows at the response positions."""

    def __init__(self, model, head=None):
        from asymagent.kv.cache import ModelCache

        self.cache = ModelCache(model)
        self.head = head  # DraftHead for a drafter (hidden -> full logits); None: a verifier

    def _prefill(self, prompt: list) -> None:
        kept = self.cache.reuse_prefix(prompt)
        self.cache.prefill(prompt[kept:-1], desc="prefill")

    def rows(self, prompt: list, response: list):
        """log p(response[i] | prompt + response[:i]) rows, [T, V] float32."""
        import torch

        self._prefill(prompt)
        feed = prompt[-1:] + response[:-1]
        if self.head is not None:
            logits = self.head.full_logits(self.cache.forward_hidden(feed))
        else:
            logits = self.cache.forward_logits(feed, keep=len(feed))
        return torch.log_softmax(logits.float(), dim=-1)

    def greedy(self, prompt: list, max_new: int, eos: set):
        """Mode full's greedy response and its rows: (tokens, [T, V] log-probs)."""
        import torch

        self._prefill(prompt)
        tokens, rows, feed = [], [], prompt[-1:]
        for _ in range(max_new):
            row = torch.log_softmax(self.cache.forward_logits(feed, keep=1)[0].float(), dim=-1)
            token = int(row.argmax())
            tokens.append(token)
            rows.append(row)
            if token in eos:
                break
            feed = [token]
        return tokens, torch.stack(rows)


@dataclass
class Position:
    """One response token: the divergences and top-1 checks of one conversation step."""

    suite: str
    seed: int
    step: int
    cls: str
    kl_c: float  # KL(v_f || v_c)
    jsd: float  # JSD(a || b), the drafter's two views
    top1_c: bool  # argmax v_c == argmax v_f
    kl_f: list = field(default_factory=list)  # per variant KL(v_f || fused)
    top1_f: list = field(default_factory=list)  # per variant argmax fused == argmax v_f
    drafter_top1: bool = False  # argmax a == argmax v_f (the drafter alone, full view)


def measure_conversation(engine, conv: Conversation, variants: list, *, max_new_tokens: int = 48,
                         max_steps: int | None = None) -> list:
    """Positions of every assistant turn of `conv` (up to `max_steps`), teacher-forced along full."""
    import torch

    from asymagent.chat.session import drafter_logprob_fn
    from asymagent.context.views import ContextViews
    from asymagent.decoding.copy_delta import copy_delta_rows
    from asymagent.decoding.model_drafter import DraftHead
    from asymagent.kernels.gate_reference import jsd_from_log_probs

    head = DraftHead(engine.drafter, None)
    vf, vc = _Reader(engine.verifier), _Reader(engine.verifier)
    da, db = _Reader(engine.drafter, head), _Reader(engine.drafter, head)
    views = ContextViews(engine.tokenizer, engine.compression, engine.chat_format)
    key = f"fusion-{conv.suite}-{conv.seed}"
    logprob_fn = drafter_logprob_fn(engine, key, [0])
    cuts = [i for i, m in enumerate(conv.messages) if m["role"] == "assistant"]
    out = []
    with torch.inference_mode():
        for step, cut in enumerate(cuts[: max_steps or None]):
            pair = views.build(conv.messages[:cut], conv.tools, logprob_fn=logprob_fn)
            response, lf = vf.greedy(pair.full_ids, max_new_tokens, engine.eos_ids)
            lc = vc.rows(pair.compressed_ids, response)
            la = da.rows(pair.full_ids, response)
            lb = db.rows(pair.compressed_ids, response)
            jsd = jsd_from_log_probs(la, lb)  # [T]
            top_f = lf.argmax(-1)  # [T]
            kl = lambda q: (lf.exp() * (lf - q)).sum(-1)  # noqa: E731  [T] KL(v_f || q)
            kl_c, top1_c = kl(lc), lc.argmax(-1) == top_f
            copy_rows = {key: copy_delta_rows(pair.full_ids, pair.compressed_ids, response, lc.shape[-1],
                                              min_len=key[0], rule=key[1])
                         for key in {v.copy_key for v in variants if v.copy}}  # {(min length, rule): [T, V]}
            fused = [fused_logprobs(lc, la, lb, jsd, v, copy_rows) for v in variants]
            kl_fs = [kl(f) for f in fused]
            top1_fs = [f.argmax(-1) == top_f for f in fused]
            drafter_top1 = la.argmax(-1) == top_f
            classes = token_classes(engine.tokenizer, conv.tools, response, engine.vocab_size)
            for i in range(len(response)):
                out.append(Position(conv.suite, conv.seed, step, classes[i], float(kl_c[i]), float(jsd[i]),
                                    bool(top1_c[i]), [float(k[i]) for k in kl_fs],
                                    [bool(t[i]) for t in top1_fs], bool(drafter_top1[i])))
    engine.caches.drop(key)
    return out


# --------------------------------------------------------------------------- summaries
def summarize(positions: list, variants: list) -> dict:
    """Sums and rates over `positions` (see the module docstring)."""
    n = len(positions)
    if not n:
        return {"positions": 0}
    kl_c = sum(p.kl_c for p in positions)
    out = {"positions": n, "kl_compressed": kl_c / n, "top1_compressed": sum(p.top1_c for p in positions) / n,
           "top1_drafter": sum(p.drafter_top1 for p in positions) / n,
           "mean_jsd": sum(p.jsd for p in positions) / n,
           "compressed_differs": sum(not p.top1_c for p in positions), "variants": {}}
    for j, v in enumerate(variants):
        kl_f = sum(p.kl_f[j] for p in positions)
        out["variants"][v.name] = {
            "kl_fused": kl_f / n,
            "recovered_share": (1.0 - kl_f / kl_c) if kl_c > 0 else None,
            "top1_fused": sum(p.top1_f[j] for p in positions) / n,
            "fixed": sum((not p.top1_c) and p.top1_f[j] for p in positions),
            "broken": sum(p.top1_c and not p.top1_f[j] for p in positions),
        }
    return out


def bootstrap_share(positions: list, j: int, rounds: int = 1000, seed: int = 0) -> list | None:
    """[2.5%, 97.5%] of the recovered share of variant j, resampling conversations."""
    groups: dict = {}
    for p in positions:
        g = groups.setdefault((p.suite, p.seed), [0.0, 0.0])
        g[0] += p.kl_c
        g[1] += p.kl_f[j]
    sums = list(groups.values())
    if len(sums) < 2:
        return None
    rng = random.Random(seed)
    shares = []
    for _ in range(rounds):
        pick = [sums[rng.randrange(len(sums))] for _ in sums]
        c = sum(x[0] for x in pick)
        if c > 0:
            shares.append(1.0 - sum(x[1] for x in pick) / c)
    shares.sort()
    return [shares[int(0.025 * len(shares))], shares[int(0.975 * len(shares)) - 1]] if shares else None


def report(positions: list, variants: list) -> dict:
    suites = sorted({p.suite for p in positions}, key=lambda s: (s.startswith("domain:"), s))
    out = {"overall": summarize(positions, variants),
           "suites": {s: summarize([p for p in positions if p.suite == s], variants) for s in suites},
           "classes": {c: summarize([p for p in positions if p.cls == c], variants) for c in CLASSES}}
    for j, v in enumerate(variants):
        out["overall"]["variants"][v.name]["recovered_share_ci95"] = bootstrap_share(positions, j)
        for s in suites:
            sub = [p for p in positions if p.suite == s]
            out["suites"][s]["variants"][v.name]["recovered_share_ci95"] = bootstrap_share(sub, j)
    return out


def markdown(result: dict) -> str:
    """The tables of a result: one row per suite (and overall), then per token class."""
    variants = result["settings"]["variants"]

    def rows(title: str, groups: dict) -> list:
        lines = [f"### {title}", "",
                 "| group | positions | KL(v_f‖v_c) | top-1 compressed | drafter JSD | variant | KL(v_f‖fused) | "
                 "recovered share [95% CI] | top-1 fused | fixed / broken |",
                 "|---|---|---|---|---|---|---|---|---|---|"]
        for name, g in groups.items():
            if not g.get("positions"):
                continue
            for v in variants:
                d = g["variants"][v]
                ci = d.get("recovered_share_ci95")
                share = "-" if d["recovered_share"] is None else f"{d['recovered_share']:+.3f}"
                if ci:
                    share += f" [{ci[0]:+.2f}, {ci[1]:+.2f}]"
                lines.append(f"| {name} | {g['positions']} | {g['kl_compressed']:.4f} | {g['top1_compressed']:.3f} | "
                             f"{g['mean_jsd']:.4f} | {v} | {d['kl_fused']:.4f} | {share} | {d['top1_fused']:.3f} | "
                             f"{d['fixed']} / {d['broken']} |")
        return lines + [""]

    s = result["settings"]
    head = [f"# Delta-fusion, token by token ({s['split']} seeds, drafter: {result['drafter']})", "",
            f"`{s['command']}`", ""]
    groups = dict(result["suites"])
    groups["overall"] = result["overall"]
    return "\n".join(head + rows("By suite", groups) + rows("By token class", result["classes"]))


def plot(result: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = dict(result["suites"])
    groups["overall"] = result["overall"]
    names = [n for n, g in groups.items() if g.get("positions")]
    v0 = result["settings"]["variants"][0]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    x = range(len(names))
    axes[0].bar([i - 0.2 for i in x], [groups[n]["kl_compressed"] for n in names], 0.4, label="KL(v_f‖v_c)")
    axes[0].bar([i + 0.2 for i in x], [groups[n]["variants"][v0]["kl_fused"] for n in names], 0.4,
                label=f"KL(v_f‖fused) {v0}")
    axes[0].set_ylabel("nats / token")
    axes[1].bar([i - 0.2 for i in x], [groups[n]["top1_compressed"] for n in names], 0.4, label="compressed")
    axes[1].bar([i + 0.2 for i in x], [groups[n]["variants"][v0]["top1_fused"] for n in names], 0.4, label="fused")
    axes[1].set_ylabel("top-1 agreement with v_f")
    axes[1].set_ylim(min(0.8, min(groups[n]["top1_compressed"] for n in names) - 0.02), 1.0)
    for ax in axes:
        ax.set_xticks(list(x), names, rotation=20)
        ax.legend()
    fig.suptitle("delta-fusion vs the full-context verifier (lower KL, higher agreement is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suites", default=DEFAULT_SUITES,
                   help="comma list: records, fs_audit, tickets, injection, domain:NAME (a synthetic domain)")
    p.add_argument("--variants", default="beta=1",
                   help="';'-separated fusion variants, each 'beta=B[,jsd_min=X][,jsd_scale=S][,copy=W][,copy_min=L][,copy_unseen=1]'")
    p.add_argument("--episodes", type=int, default=2, help="conversations (seeds) per suite")
    p.add_argument("--split", choices=("dev", "test"), default="dev")
    p.add_argument("--seeds", default=None, help="comma list of exact seeds (overrides --split/--episodes)")
    p.add_argument("--max-steps", type=int, default=None, help="assistant turns per conversation (default all)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="greedy tokens of mode full per turn")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--report", metavar="DIR", help="fusion.md + fusion.png here")
    p.add_argument("--verifier", default="default")
    p.add_argument("--drafter", default=None, help="drafter .safetensors (default: the shipped one)")
    p.add_argument("--compression", metavar="FILE", default=None)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--resume", action="store_true",
                   help="keep the conversations already in --json (written after each one) and measure the rest")


def run(engine, suites: list, variants: list, *, split: str = "test", episodes: int = 2, seeds=None,
        max_steps=None, max_new_tokens: int = 48, progress: bool = True, done: list | None = None,
        on_conversation=None) -> tuple[list, dict]:
    """(positions, timing) over every conversation of `suites`.

    `done`: positions of an earlier, interrupted run (its conversations are not measured again);
    `on_conversation(positions)` is called after each conversation (main saves a partial JSON).
    """
    from tqdm.auto import tqdm

    from asymagent.evals.suites.environments import pick_seeds

    # eval suites and synthetic domains alike: DEV_SEEDS (0..) or TEST_SEEDS (100000..); drafter
    # training draws its episodes from dev seeds only
    convs = [c for s in suites for c in conversations(s, pick_seeds(split, episodes, seeds))]
    positions = list(done or [])
    measured = {(p.suite, p.seed) for p in positions}
    t0 = time.perf_counter()
    for conv in tqdm(convs, desc="fusion", unit="conv", disable=not progress):
        if (conv.suite, conv.seed) in measured:
            continue
        positions += measure_conversation(engine, conv, variants, max_new_tokens=max_new_tokens,
                                          max_steps=max_steps)
        if on_conversation is not None:
            on_conversation(positions)
    return positions, {"conversations": len(convs), "wall_s": round(time.perf_counter() - t0, 1)}


def _load_done(path, variants: list) -> list:
    """Positions of an interrupted run's JSON (same variants), for --resume."""
    from pathlib import Path

    if not path or not Path(path).is_file():
        return []
    data = json.loads(Path(path).read_text())
    if data.get("settings", {}).get("variants") != [v.name for v in variants]:
        raise SystemExit(f"--resume: {path} was measured with other variants")
    return [Position(**p) for p in data.get("positions", [])]


def main(args) -> int:
    from asymagent.evals.running.engine_setup import build_engine

    suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    from asymagent.evals.suites.environments import SUITES

    for s in suites:
        if s not in SUITES and not s.startswith("domain:"):
            raise SystemExit(f"asymagent eval fusion: unknown suite {s!r} (use {', '.join(SUITES)} or domain:NAME)")
    variants = parse_variants(args.variants)
    compression = None
    if args.compression:
        from asymagent.context.views import CompressionConfig

        compression = CompressionConfig.from_file(args.compression)
    setup = build_engine(args.verifier, args.drafter, compression=compression)
    done = _load_done(args.json, variants) if getattr(args, "resume", False) else []

    def document(positions: list, timing: dict, partial: bool) -> dict:
        return {"verifier": setup.verifier, "drafter": setup.drafter,
                "settings": {"suites": suites, "variants": [v.name for v in variants], "split": args.split,
                             "episodes": args.episodes, "seeds": args.seeds, "max_steps": args.max_steps,
                             "max_new_tokens": args.max_new_tokens, **timing, "partial": partial,
                             "command": (" ".join(["asymagent"] + sys.argv[1:]) if sys.argv[1:2] == ["eval"]
                                         else " ".join(["python -m asymagent.evals.running.fusion"] + sys.argv[1:])),
                             "compression": setup.engine.compression.model_dump(mode="json")},
                **report(positions, variants)}

    def save(positions: list, timing: dict, partial: bool) -> dict:
        doc = document(positions, timing, partial)
        if args.json:
            tmp = args.json + ".tmp"
            with open(tmp, "w") as f:
                json.dump({**doc, "positions": [asdict(p) for p in positions]}, f)
            os.replace(tmp, args.json)
        return doc

    positions, timing = run(setup.engine, suites, variants, split=args.split, episodes=args.episodes,
                            seeds=args.seeds, max_steps=args.max_steps, max_new_tokens=args.max_new_tokens,
                            progress=not args.quiet, done=done,
                            on_conversation=lambda ps: save(ps, {}, partial=True))
    result = save(positions, timing, partial=False)
    text = markdown(result)
    if args.report:
        from pathlib import Path

        out = Path(args.report)
        out.mkdir(parents=True, exist_ok=True)
        (out / "fusion.md").write_text(text + "\n")
        plot(result, out / "fusion.png")
    if not args.quiet:
        print(text)
    return 0


if __name__ == "__main__":
    _p = argparse.ArgumentParser(prog="python -m asymagent.evals.running.fusion", description=__doc__.splitlines()[0])
    add_arguments(_p)
    raise SystemExit(main(_p.parse_args()))
