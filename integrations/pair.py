"""`asymagent pair [NAME]`: check, assemble and convert a named model pair (docs/pair.md).

Without `--convert` it assembles the pair's GGUF files from their installed part packages and
checks their size and sha256 (a refusal, in one line, carries the exact pip command); with it, it
also makes the dequantised cache in the engine's dtype (loading each model once) where it is
missing, so later loads take seconds, and prints how long each step took. Where the cache is
there already, it says so and loads nothing: before (issue 53), every `make demo` loaded both
models here only to drop them, ~7 s of its start; whether a cache's weights load is the engine's
load to find out (a broken cache is dequantised again there). `make setup-pair` installs the
parts and runs `asymagent pair qwen2.5-coder --convert`.
"""

from __future__ import annotations

import time


def add_arguments(p) -> None:
    p.add_argument("name", nargs="?", default="qwen2.5-coder", help="the pair's name")
    p.add_argument("--convert", action="store_true",
                   help="also load each model once (writes the dequantised cache)")
    p.add_argument("--dtype", default="auto", help="the cache's dtype (auto: the engine's)")


def check_args(args) -> None:
    from asymagent.modeling.pairs import check_pair

    check_pair(args.name)  # ValueError (unknown name) / PairNotInstalledError (missing parts)


def main(args) -> int:
    from asymagent.modeling.cpu_dtype import resolve_dtype
    from asymagent.modeling.loading import converted_cache, load_model
    from asymagent.modeling.pairs import assemble, get_pair

    pair = get_pair(args.name)
    print(f"{pair.name}: {pair.description}")
    for role, gguf in (("verifier", pair.verifier), ("drafter", pair.drafter)):
        start = time.perf_counter()
        path = assemble(gguf)
        line = f"  {role}: {path} ({gguf.size / 1e9:.2f} GB, sha256 ok, {time.perf_counter() - start:.1f} s)"
        cached = converted_cache(path, resolve_dtype(args.dtype)[0]) if args.convert else None
        if cached is not None:
            line += f"; converted already: {cached} (the engine loads it at start)"
        elif args.convert:
            start = time.perf_counter()
            loaded = load_model(path, dtype=args.dtype)
            dtype = str(next(loaded.model.parameters()).dtype).removeprefix("torch.")
            line += f"; loaded in {dtype} in {time.perf_counter() - start:.1f} s"
            del loaded
        print(line, flush=True)
    return 0
