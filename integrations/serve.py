"""`asymagent serve`: the command that loads an Engine and runs the OpenAI-compatible app on uvicorn.

The app itself is `openai_server.create_app`. Flags follow vLLM's names where vLLM has one
(`--model`, `--served-model-name`, `--max-model-len`, `--dtype`, `--device`, `--allowed-origins`)
next to ours (`--verifier`, `--model-name`). `check_args` refuses arguments that cannot work
(ranges, a missing or malformed --config, --drafter layers:N, an unavailable device, a custom
verifier without a drafter in a speculative mode) before any model loads.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from asymagent.integrations.openai_server import DEFAULT_MODEL_NAME, create_app

MODES = ("full", "compressed", "spec", "asym")
DTYPES = ("auto", "float32", "bfloat16", "float16")


def _bounded(kind, low=None, high=None, *, above: bool = False):
    """An argparse type: `kind(text)` within [low, high] (low excluded when `above`)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a{'n integer' if kind is int else ' number'}, "
                                             f"got {text!r}") from None
        if low is not None and (value <= low if above else value < low):
            raise argparse.ArgumentTypeError(f"must be {'>' if above else '>='} {low}, got {text}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high}, got {text}")
        return value
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """CLI flags of `asymagent serve` (light: no heavy imports here)."""
    parser.add_argument("--host", default="127.0.0.1", help="bind address")
    parser.add_argument("--port", type=_bounded(int, 0, 65535), default=8000,
                        help="TCP port (0: any free port)")
    parser.add_argument("--verifier", "--model", dest="verifier", default="default",
                        help="the verifier: 'default' (embedded SmolLM2-135M), a directory, a "
                             ".gguf or a cached HF id (--model: vLLM's name)")
    parser.add_argument("--drafter", default=None,
                        help="a directory/.gguf/HF id/.safetensors drafter, or 'layers:N' for an "
                             "untrained drafter made of the verifier's first N layers (unset: the "
                             "shipped drafter of the embedded verifier)")
    parser.add_argument("--config", default=None,
                        help="JSON/YAML file with 'spec' (SpecConfig) and/or 'compression' "
                             "(CompressionConfig) sections")
    parser.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer KEY' on /v1/* (unset: "
                             "$ASYMAGENT_API_KEY, else no key)")
    parser.add_argument("--max-queue", type=_bounded(int, 1), default=16,
                        help="requests allowed to wait for the engine (429 beyond)")
    parser.add_argument("--request-timeout", type=_bounded(float, 0, above=True), default=600.0,
                        help="seconds from arrival to completion before a request is cut off")
    parser.add_argument("--mode", default="asym", choices=MODES,
                        help="decoding mode when a request does not set `mode`")
    parser.add_argument("--max-tokens", type=_bounded(int, 1), default=256,
                        help="completion tokens when a request sets no max_tokens")
    parser.add_argument("--temperature", type=_bounded(float, 0, 2), default=0.0,
                        help="temperature when a request sets none (0 = greedy, the paper's)")
    parser.add_argument("--max-sessions", type=_bounded(int, 1), default=8,
                        help="conversations whose KV caches the engine keeps (LRU)")
    parser.add_argument("--model-name", "--served-model-name", dest="model_name",
                        default=DEFAULT_MODEL_NAME,
                        help="the model id on /v1/models; requests must name it "
                             "(--served-model-name: vLLM's name)")
    parser.add_argument("--max-model-len", type=_bounded(int, 2), default=None,
                        help="context limit (prompt + completion) below the model's own (unset: "
                             "the model's max_position_embeddings)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES,
                        help="weights dtype ('auto': float32 on CPU, bfloat16 on CUDA)")
    parser.add_argument("--device", default="cpu",
                        help="'cpu', 'cuda', 'cuda:N' or 'auto' (CUDA when available)")
    parser.add_argument("--threads", type=_bounded(int, 1), default=None,
                        help="torch CPU threads (unset: torch's choice, the core count)")
    parser.add_argument("--allowed-origins", nargs="+", default=None, metavar="ORIGIN",
                        help="browser origins allowed by CORS, e.g. http://localhost:3000, or * "
                             "(unset: no CORS; a browser preflight is refused)")
    parser.add_argument("--log-level", default="info",
                        choices=("critical", "error", "warning", "info", "debug", "trace"))


def read_config(path: str) -> dict:
    """{'spec': SpecConfig | None, 'compression': CompressionConfig | None} from --config."""
    from asymagent.context.views import CompressionConfig
    from asymagent.spec_config import SpecConfig

    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--config {path}: no such file")
    text = file.read_text()
    try:
        if path.endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
    except Exception as exc:  # yaml.YAMLError / json.JSONDecodeError: a message for the user
        raise ValueError(f"--config {path}: cannot parse it ({exc})") from None
    unknown = set(data) - {"spec", "compression"} if isinstance(data, dict) else None
    if not isinstance(data, dict) or unknown:
        raise ValueError(f"--config {path}: expected a mapping with 'spec' and/or 'compression'"
                         + (f", found {sorted(unknown)}" if unknown else ""))
    try:
        spec = SpecConfig(**data["spec"]) if "spec" in data else None
        if spec is not None:
            spec.validate()
        compression = CompressionConfig(**data["compression"]) if "compression" in data else None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"--config {path}: {exc}") from None
    return {"spec": spec, "compression": compression}


def resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return name
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ValueError(f"--device {name}: CUDA is not available on this machine")
        index = name.partition(":")[2]
        if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
            raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} "
                             "CUDA device(s)")
        return name
    raise ValueError(f"--device must be cpu, cuda, cuda:N or auto, got {name!r}")


def resolve_dtype(name: str, device: str):
    import torch

    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, name)


def check_args(args) -> None:
    """Refuse arguments that cannot work, before any model loads (ValueError names the flag)."""
    from asymagent.integrations.engine_source import check_source

    if args.config:
        read_config(args.config)
    try:
        check_source(args.verifier, args.drafter, args.mode)
    except ValueError as exc:
        raise ValueError(f"--{exc}") from None  # the message starts with the flag's name
    resolve_device(args.device)
    for origin in args.allowed_origins or ():
        if origin != "*" and not origin.startswith(("http://", "https://")):
            raise ValueError(f"--allowed-origins: {origin!r} is not an origin "
                             "(scheme://host[:port]) or *")


def load_engine(args):
    """Engine for `asymagent serve` from --verifier/--drafter/--config/--dtype/--device."""
    from asymagent.integrations.engine_source import open_engine

    check_args(args)
    config = read_config(args.config) if args.config else {"spec": None, "compression": None}
    device = resolve_device(args.device)
    return open_engine(args.verifier, args.drafter, mode=args.mode, spec=config["spec"],
                       compression=config["compression"],
                       dtype=resolve_dtype(args.dtype, device), device=device,
                       max_sessions=args.max_sessions)


def main(args) -> int:
    import logging

    import uvicorn

    check_args(args)
    api_key = args.api_key or os.environ.get("ASYMAGENT_API_KEY")
    if args.host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        logging.warning("serving on %s without --api-key: anyone who can reach it can use it",
                        args.host)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    engine = load_engine(args)
    app = create_app(engine, model_name=args.model_name, api_key=api_key,
                     max_queue=args.max_queue, request_timeout=args.request_timeout,
                     default_mode=args.mode, default_max_tokens=args.max_tokens,
                     default_temperature=args.temperature, cors_origins=args.allowed_origins,
                     max_model_len=args.max_model_len)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
