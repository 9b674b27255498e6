"""Setting up `asymagent serve` from its flags: the --config file, checks before any model loads, the engine.

`check_args` refuses mistakes (a missing model path, an unknown config key, a bad --drafter
layers:N, out-of-range numbers) with a ValueError/OSError that `asymagent` prints on one line
(integrations/cli.py); `load_engine` builds the Engine from --verifier/--drafter/--config.
"""

from __future__ import annotations

from asymagent.config_file import read_config  # noqa: F401  (the --config file; also used below)


def check_args(args) -> None:
    """Refuse mistakes before any model loads (integrations/cli.py prints them on one line)."""
    from asymagent.modeling.loading import check_drafter_source, check_model_source

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    for flag, value, low in (("--max-queue", args.max_queue, 1), ("--max-tokens", args.max_tokens, 1),
                             ("--max-sessions", args.max_sessions, 1),
                             ("--max-body-bytes", args.max_body_bytes, 1)):
        if value < low:
            raise ValueError(f"{flag} must be >= {low}, got {value}")
    if getattr(args, "trace_dir", None) is not None:
        import os

        if os.path.exists(args.trace_dir) and not os.path.isdir(args.trace_dir):
            raise ValueError(f"--trace-dir {args.trace_dir} is a file; it must be a directory (created if missing)")
        if not args.trace_max_mb > 0 or (args.trace_max_files is not None and args.trace_max_files < 1):
            raise ValueError("--trace-max-mb must be > 0 and --trace-max-files >= 1")
    if not args.request_timeout > 0:
        raise ValueError(f"--request-timeout must be > 0, got {args.request_timeout}")
    if args.config:
        read_config(args.config)
    check_model_source(args.verifier)
    drafter = args.drafter
    if drafter is not None and drafter.startswith("layers:"):
        layers = drafter.split(":", 1)[1]
        if not layers.isdigit() or int(layers) < 1:
            raise ValueError(f"--drafter layers:N needs an integer N >= 1, got {drafter!r}")
    elif drafter is not None:
        check_drafter_source(drafter)
    elif args.verifier != "default" and args.mode in ("spec", "asym"):
        raise ValueError(NO_DRAFTER.format(verifier=args.verifier, mode=args.mode))


NO_DRAFTER = ("--verifier {verifier} has no drafter, but --mode is {mode!r}: pass --drafter (a "
              "trained drafter, or layers:N for an untrained cut of the verifier) or --mode "
              "full/compressed")


def load_engine(args):
    """Engine for `asymagent serve` from --verifier/--drafter/--config (+ --suffix-store)."""
    engine = _build_engine(args)
    if getattr(args, "suffix_store", None):
        from asymagent.decoding.suffix_store import SuffixStore

        engine.suffix_store = SuffixStore(path=args.suffix_store)
    return engine


def _build_engine(args):
    from asymagent.engine import Engine
    from asymagent.context.views import CompressionConfig

    spec, compression = read_config(args.config) if args.config else (None, None)
    extra = {k: v for k, v in (("spec", spec), ("compression", compression)) if v is not None}
    extra["max_sessions"] = args.max_sessions
    drafter = args.drafter
    if drafter is not None and drafter.startswith("layers:"):
        # An untrained drafter made of the verifier's first N layers (sharing its embeddings
        # and head): speculation works without a trained drafter, at lower acceptance.
        from asymagent.modeling.drafter import build_drafter
        from asymagent.modeling.loading import load_model

        try:
            layers = int(drafter.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"--drafter layers:N needs an integer N, got {drafter!r}") from None
        ver = load_model(args.verifier)
        draft = build_drafter(ver.model, num_layers=layers, init_from_verifier=True).eval()
        if compression is None:
            compression = CompressionConfig()
        return Engine(verifier=ver.model, drafter=draft, tokenizer=ver.tokenizer, spec=spec,
                      compression=compression, max_sessions=args.max_sessions,
                      verifier_fingerprint=ver.fingerprint)
    if args.verifier == "default" and drafter is None:
        return Engine.from_default(**extra)
    if drafter is None and args.mode in ("spec", "asym"):
        # refuse now rather than answer every default request with a 400
        raise ValueError(NO_DRAFTER.format(verifier=args.verifier, mode=args.mode))
    return Engine.from_pretrained(verifier=args.verifier, drafter=drafter, **extra)
