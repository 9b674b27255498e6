"""Where the rows a step needs rank among the rows the view cuts: by a reader's attention (drafter or verifier, by layer band, with look-ahead), its surprise, and shared rare words.

    python -m asymagent.evals.probes.cut_row_rank --pair qwen2.5-coder --suite tickets --split dev --step 3 --mark "-> team Raven" [--reader verifier] [--lookahead 24] [--json PATH]

For one step of a suite episode (the frontier's steps: the oracle's history, `--max-steps` spread
over the episode), rebuilds the default view and lists the rows (query_keep units) it cuts from
earlier tool outputs. Each is ranked three ways:

- `attention`: the largest attention (max over heads, mean over layers: kv/attention.py
  AttentionCapture) any of its tokens gets from the drafter's rows reading the newest block (the
  messages since the last assistant turn, at most `--rows`), pooled by max over those rows
  (attention keep's signal, asymagent/context/attention_keep.py);
- `surprise`: the drafter's mean negative log-prob of its tokens over the full view
  (LLMLingua's signal, the surprisal compressor's);
- `attention_L<a>-<b>`: the same from layers a..b-1 only (the depth in quarters, and the first
  half: GemFilter's idea, a selection read from a model's early layers, costs those layers only);
  `best_layer`: the marked row's best rank over single layers (what no fixed choice reaches);
- `lookahead*`: the same signals read by the reader's own first `--lookahead` greedy tokens over
  the full view (Speculative Prefill's look-ahead): the rows its answer reads. With `--reader
  verifier` those tokens are full's own answer, so this is the ceiling an attention scorer
  reaches when it knows the answer;
- `lexical`: whether lexical re-admission (ContextViews._apply_lexical, query_keep's rule with
  the newest output as the query) brings it back within `--budget` tokens.

`--reader verifier` reads with the pair's 1.5B instead of the 0.5B (the verifier's own attention).
Rows matching any `--mark` substring are reported with their rank and the cut tokens ranked
above them: a signal that can choose the view ranks the row the step needs near the top.
"""

from __future__ import annotations

from asymagent.evals.probes.harness import finish, parser


def _rows(tokenizer, full: list, compressed_text: str) -> list:
    """[(first token, last token + 1, text)] of the full view's lines the compressed view lacks."""
    pieces = [tokenizer.decode([t]) for t in full]
    out, start = [], 0
    for i, piece in enumerate(pieces):
        if "\n" in piece or i == len(pieces) - 1:
            text = "".join(pieces[start:i + 1]).strip()
            if len(text) >= 4 and text not in compressed_text:
                out.append((start, i + 1, text))
            start = i + 1
    return out


def _attention(engine, key: str, full: list, rows: int, lookahead: int) -> tuple:
    """(the capture, per layer, of the newest block's last `rows` rows (forward 0) and of the
    look-ahead's `lookahead` greedy decode rows (forwards 1..), the look-ahead's token ids): the
    reading attention keep makes (chat/session.py `drafter_reading`), from an empty cache."""
    import torch

    from asymagent.chat.session import drafter_reading

    cache = engine.caches.session(key).get("drafter_full")
    cache.crop(0)
    with torch.inference_mode():
        cache.prefill(full[:len(full) - rows])
    return drafter_reading(engine, cache, full, rows, lookahead, per_layer=True)


def _bands(depth: int) -> list:
    """(name, layers): every layer, its quarters, its first half."""
    bounds = sorted({round(i * depth / 4) for i in range(5)})
    half = max(1, depth // 2)
    return ([("", None)] + [(f"_L{a}-{b - 1}", range(a, b)) for a, b in zip(bounds, bounds[1:])]
            + [(f"_L0-{half - 1}", range(0, half))])


def _signals(capture, read: slice, length: int, pool: str, prefix: str) -> dict:
    """name -> [length] scores of the capture's `read` forwards: all layers, the bands, and each
    layer alone."""
    if not capture.forwards[read]:
        return {}
    out = {prefix + name: capture.scores(length, pool, layers, read) for name, layers in _bands(capture.layers)}
    out.update({f"{prefix}@{i}": capture.scores(length, pool, range(i, i + 1), read)
                for i in range(capture.layers)})
    return out


def _rank(scored: list, signal: str, marks: list) -> list:
    ranked = sorted(scored, key=lambda r: -r[signal])
    out, above = [], 0
    for rank, r in enumerate(ranked):
        if any(m in r["text"] for m in marks):
            out.append({"signal": signal, "rank": rank, "cut_tokens_above": above,
                        "score": r[signal], "text": r["text"][:120]})
        above += r["tokens"]
    return out


def rank_step(engine, messages: list, tools: list, marks: list, *, rows: int = 256, budget: int = 64,
              lookahead: int = 0) -> dict:
    from asymagent.chat.session import conversation_views, drafter_logprob_fn
    from asymagent.context.compressors import CompressionConfig
    from asymagent.context.views import ContextViews

    key = "cut-row-rank"
    engine.caches.drop(key)
    pair = conversation_views(engine, key).build(messages, tools)
    full = pair.full_ids
    tok = engine.tokenizer
    cut = _rows(tok, full, tok.decode(pair.compressed_ids))
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    before = ContextViews(tok, CompressionConfig(), engine.chat_format).build(messages[:last + 1], tools).full_ids
    common = next((i for i, (a, b) in enumerate(zip(before, full)) if a != b), min(len(before), len(full)))
    block = min(rows, len(full) - common)
    logprobs = drafter_logprob_fn(engine, key, [0])(full)
    capture, ahead = _attention(engine, key, full, block, lookahead)
    signals = {**_signals(capture, slice(0, 1), len(full), "max", "attention"),
               **_signals(capture, slice(1, None), len(full), "max", "lookahead")}
    lexical_views = ContextViews(tok, CompressionConfig(readmit_lexical_tokens=budget), engine.chat_format)
    lexical_views.build(messages, tools)
    back = "".join(e.readmit for e in lexical_views.entries)
    scored = [{"text": text, "tokens": b - a, "surprise": -sum(logprobs[a:b]) / (b - a),
               "lexical": text in back, **{name: max(v[a:b]) for name, v in signals.items()}}
              for a, b, text in cut if a < common]  # rows of earlier outputs, not the newest block
    out = {"full_tokens": len(full), "compressed_tokens": len(pair.compressed_ids),
           "newest_block_tokens": len(full) - common, "cut_rows": len(scored),
           "cut_tokens": sum(r["tokens"] for r in scored), "depth": capture.layers,
           "lookahead_text": tok.decode(ahead), "marked": []}
    per_layer = [n for n in signals if "@" in n]
    for signal in [n for n in signals if "@" not in n] + ["surprise"]:
        out["marked"] += _rank(scored, signal, marks)
    for prefix in ("attention", "lookahead"):
        layers = [_rank(scored, n, marks) for n in per_layer if n.startswith(prefix + "@")]
        for i, _ in enumerate(layers[0] if layers else []):
            best = min(range(len(layers)), key=lambda j: layers[j][i]["rank"])
            out["marked"].append({**layers[best][i], "signal": f"{prefix}_best_layer", "layer": best})
    out["marked"] += [{"signal": "lexical", "brought_back": r["lexical"], "text": r["text"][:120]}
                      for r in scored if any(m in r["text"] for m in marks)]
    engine.caches.drop(key)
    return out


def main(argv=None) -> int:
    import torch

    from asymagent.evals.running.frontier import suite_conversations
    from asymagent.evals.suites.environments import make_env, pick_seeds

    p = parser(__doc__, "cut_row_rank")
    p.add_argument("--pair", default="qwen2.5-coder", help="the pair whose drafter reads (docs/pair.md)")
    p.add_argument("--suite", default="tickets")
    p.add_argument("--split", choices=("dev", "test"), default="dev")
    p.add_argument("--step", type=int, default=3, help="the frontier's step index")
    p.add_argument("--max-steps", type=int, default=6)
    p.add_argument("--mark", action="append", default=[], help="substring of a row the step needs")
    p.add_argument("--rows", type=int, default=256, help="the newest block's rows read (at most)")
    p.add_argument("--budget", type=int, default=64, help="lexical re-admission's tokens")
    p.add_argument("--reader", choices=("drafter", "verifier"), default="drafter",
                   help="whose attention and surprise: the pair's 0.5B drafter or its 1.5B verifier")
    p.add_argument("--lookahead", type=int, default=0, help="the reader's greedy tokens read as look-ahead rows")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from asymagent.engine import Engine
    from asymagent.modeling.pairs import pair_paths

    # only the reader reads here: it stands as both models (the drafter's cache is the one read)
    verifier, drafter = pair_paths(args.pair)
    reader = str(verifier if args.reader == "verifier" else drafter)
    engine = Engine.from_pretrained(reader, drafter=reader)
    conv = suite_conversations(args.suite, pick_seeds(args.split, 1, None), args.max_steps)[0]
    step = conv.steps[args.step]
    env = make_env(args.suite)
    out = {"suite": args.suite, "split": args.split, "seed": conv.seed, "step": args.step, "reader": args.reader,
           **rank_step(engine, step.history, step.tools or env.task.tools, args.mark,
                       rows=args.rows, budget=args.budget, lookahead=args.lookahead)}
    print(f"{args.suite} {args.split} step {args.step}: {out['cut_rows']} cut rows ({out['cut_tokens']} tokens)")
    for m in out["marked"]:
        print("  ", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in m.items()})
    return finish(out, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
