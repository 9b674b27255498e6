"""`asymagent serve`: the command that loads an Engine and runs the OpenAI-compatible app on uvicorn.

The app itself is `openai_server.create_app`; the checks and the engine loading are
`serve_setup.py`. Flags follow vLLM's names where vLLM has one
(`serve MODEL` or `--model`, `--served-model-name`, `--max-model-len`, `--num-speculative-tokens`,
`--dtype`, `--device`, `--allowed-origins`) next to ours (`--verifier`, `--model-name`). `check_args` refuses arguments that cannot work
(ranges, a missing or malformed --config, --drafter layers:N, an unavailable device, a custom
verifier without a drafter in a speculative mode) before any model loads.
"""

from __future__ import annotations

import argparse
import os
import sys

from asymagent.integrations.openai_server import DEFAULT_MAX_BODY_BYTES, DEFAULT_MODEL_NAME, create_app
from asymagent.integrations.serve_setup import check_args as check_single, load_engine

MODES = ("full", "compressed", "spec", "asym")
DTYPES = ("auto", "float32", "bfloat16", "float16", "int8", "int8w", "int4w")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """CLI flags of `asymagent serve` (light: no heavy imports here)."""
    parser.add_argument("model", nargs="?", default=None, metavar="MODEL",
                        help="the verifier, as --model (vLLM's positional form: `serve MODEL`)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address")
    parser.add_argument("--port", type=int, default=8000,
                        help="TCP port (0: any free port)")
    parser.add_argument("--verifier", "--model", dest="verifier", default="default",
                        help="the verifier: 'default' (embedded SmolLM2-135M), a directory, a "
                             ".gguf or a cached HF id (--model: vLLM's name)")
    parser.add_argument("--drafter", default=None,
                        help="a directory/.gguf/HF id/.safetensors drafter, or 'layers:N' for an "
                             "untrained drafter made of the verifier's first N layers (unset: the "
                             "shipped drafter of the embedded verifier)")
    parser.add_argument("--feature-head", default=None, metavar="PATH",
                        help="an EAGLE-3 feature head for the verifier (`asymagent train-drafter "
                             "--kind feature`): rounds that find no copy draft with it")
    parser.add_argument("--pair", default=None, metavar="NAME",
                        help="a named verifier + drafter pair instead of --verifier/--drafter: "
                             "'qwen2.5-coder' (Qwen2.5-Coder 1.5B + 0.5B; `make setup-pair` "
                             "installs it; docs/pair.md)")
    parser.add_argument("--num-speculative-tokens", type=int, default=None, metavar="K",
                        help="draft tokens per round, SpecConfig.k (vLLM's name; adaptive K "
                             "starts there; unset: --config's, else 2)")
    parser.add_argument("--config", default=None,
                        help="JSON/YAML file with 'spec' (SpecConfig) and/or 'compression' "
                             "(CompressionConfig) sections")
    parser.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer KEY' on /v1/* (unset: "
                             "$ASYMAGENT_API_KEY, else no key)")
    parser.add_argument("--max-queue", type=int, default=16,
                        help="requests allowed to wait for the engine (429 beyond)")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help="largest request body accepted, in bytes (413 beyond; 8 MiB is "
                             "several times a 128k-token conversation)")
    parser.add_argument("--request-timeout", type=float, default=600.0,
                        help="seconds from arrival to completion before a request is cut off")
    parser.add_argument("--mode", default="asym", choices=MODES,
                        help="decoding mode when a request does not set `mode`")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="cap on completion tokens when a request sets no max_tokens (unset: "
                             "no cap, as OpenAI and vLLM: the end token or the context limit)")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="temperature when a request sets none (0 = greedy, the paper's)")
    parser.add_argument("--suffix-store", metavar="FILE", default=None,
                        help="keep earlier responses for suffix drafts in this .npz file (read at "
                             "start, written after every response), so drafting improves across restarts")
    parser.add_argument("--max-sessions", type=int, default=8,
                        help="conversations whose KV caches the engine keeps (LRU)")
    parser.add_argument("--max-num-seqs", type=int, default=8,
                        help="requests decoded at once, their forwards batched round by round "
                             "(continuous batching; a request's tokens are the same as alone); "
                             "1: one at a time")
    parser.add_argument("--max-num-batched-tokens", type=int, default=32,
                        help="rows of one batched forward (at most 32 on the CPU path, the packed "
                             "kernel's bit-invariant limit)")
    parser.add_argument("--model-name", "--served-model-name", dest="model_name", nargs="+",
                        default=[DEFAULT_MODEL_NAME], metavar="NAME",
                        help="the model id(s) on /v1/models; requests must name one of them, "
                             "answers carry the first (--served-model-name: vLLM's name)")
    parser.add_argument("--chat-template", metavar="FILE|STRING", default=None,
                        help="the chat template (a Jinja file, or the template itself) for a model "
                             "without one, or to replace its own (vLLM's flag); text completions "
                             "need none")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="context limit (prompt + completion) below the model's own (unset: "
                             "the model's max_position_embeddings)")
    parser.add_argument("--dtype", default="auto", choices=DTYPES,
                        help="weights dtype ('auto': bfloat16 on CUDA and on a CPU with bf16 matrix units "
                             "(AMX / AVX512-BF16), float32 elsewhere; 'int8': dynamic int8 linear layers on "
                             "the CPU; 'int8w' / 'int4w': weight-only int8 / int4 decoder linears for decode "
                             "and verify rows (docs/cpu.md); logits and the gate stay float32; docs/engine.md)")
    parser.add_argument("--device", default="cpu",
                        help="'cpu', 'cuda', 'cuda:N' or 'auto' (CUDA when available)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (unset: the CPUs this process may use: its affinity and "
                             "cgroup quota; asymagent/modeling/cpu_threads.py)")
    parser.add_argument("--allowed-origins", nargs="+", default=None, metavar="ORIGIN",
                        help="browser origins allowed by CORS, e.g. http://localhost:3000, or * "
                             "(unset: no CORS; a browser preflight is refused)")
    parser.add_argument("--trace-dir", metavar="DIR", default=None,
                        help="capture every completed request as a JSONL trace line in DIR (off by "
                             "default; docs/evals.md, 'Captured traces'); never headers or the API key")
    parser.add_argument("--trace-max-mb", type=float, default=64.0,
                        help="with --trace-dir: start a new trace file when one would pass this size")
    parser.add_argument("--trace-max-files", type=int, default=None,
                        help="with --trace-dir: keep at most this many trace files (oldest deleted)")
    parser.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                        help="serve from --replicas engine replicas on Ray Serve, each conversation "
                             "kept on its replica (no ADDRESS: a new local Ray on 127.0.0.1; `auto` "
                             "or HOST:PORT or ray://HOST:10001 joins a cluster; docs/serving.md, "
                             "'Ray'; pip install 'asymagent[ray]')")
    parser.add_argument("--replicas", type=int, default=2, help="with --ray: engine replicas")
    parser.add_argument("--replica-cpus", type=float, default=1.0,
                        help="with --ray: CPUs per replica (also its torch threads)")
    parser.add_argument("--replica-gpus", type=float, default=0.0,
                        help="with --ray: GPUs per replica")


def check_args(args) -> None:
    """The verb's hook: refuse what cannot work before any model loads (serve_setup.py; the
    --ray flags and Ray itself: ray_serve/launch.py)."""
    if args.ray and args.device != "cpu":  # a cluster: each replica's node checks its device
        check_single(argparse.Namespace(**{**vars(args), "device": "cpu"}))
    else:
        check_single(args)
    if args.ray is not None:
        from asymagent.integrations.ray_serve.launch import check_ray

        check_ray(args)


def main(args) -> int:
    import logging

    if args.ray is not None:
        from asymagent.integrations.ray_serve.launch import main as serve_on_ray

        return serve_on_ray(args)

    import uvicorn

    api_key = args.api_key or os.environ.get("ASYMAGENT_API_KEY")
    if args.host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        logging.warning("serving on %s without --api-key: anyone who can reach it can use it",
                        args.host)
    engine = load_engine(args)  # torch's threads: --threads, set by integrations/cli.py
    from asymagent.model_banner import model_banner

    print(f"asymagent serve: models\n{model_banner(engine).text()}", file=sys.stderr, flush=True)
    if getattr(engine.tokenizer, "chat_template", None) is None:
        logging.warning("the model has no chat template: /v1/completions works, chat requests are "
                        "refused; give one with --chat-template FILE|STRING")
    writer = None
    if args.trace_dir:
        from asymagent.trace_capture import TraceWriter

        writer = TraceWriter(args.trace_dir, max_bytes=int(args.trace_max_mb * 2**20),
                             max_files=args.trace_max_files, secrets=(api_key,) if api_key else ())
    app = create_app(engine, model_name=args.model_name, api_key=api_key, trace_writer=writer,
                     max_queue=args.max_queue, request_timeout=args.request_timeout,
                     max_body_bytes=args.max_body_bytes,
                     default_mode=args.mode, default_max_tokens=args.max_tokens,
                     default_temperature=args.temperature, cors_origins=args.allowed_origins,
                     max_model_len=args.max_model_len)
    uvicorn.run(app, host=args.host, port=args.port,
                log_level=getattr(args, "log_level", None) or "info")  # --log-level: cli.py
    return 0
