"""Setting up `asymagent serve` from its flags: the --config file, checks before any model loads, the engine.

`check_args` refuses mistakes (a missing model path, an unknown config key, a bad --drafter
layers:N (past the verifier's layer count too), out-of-range numbers, an unavailable --device,
a malformed origin, a --host that is not an address of this machine)
with a
ValueError/OSError that `asymagent` prints on one line (integrations/cli.py); `load_engine`
builds the Engine from --verifier/--drafter/--config/--dtype/--device (integrations/engine_source.py).
"""

from __future__ import annotations

from pathlib import Path

from asymagent.config_file import read_config  # noqa: F401  (the --config file; also used below)


def resolve_device(name: str) -> str:
    """--device -> a torch device name; ValueError when it is not there."""
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
    """--dtype as the loaders take it: a name ("auto" follows the device and the CPU's matrix units,
    asymagent/modeling/cpu_dtype.py; "int8" quantises the linear layers)."""
    from asymagent.modeling.cpu_dtype import resolve_dtype as check

    check(name, device)  # an unknown name is refused here, before any model loads
    return name


def use_pair(args) -> None:
    """`--pair NAME`: the verifier becomes "pair:NAME" (its drafter the pair's unless --drafter
    names another); refused with --verifier/--model or a positional model beside it."""
    name = getattr(args, "pair", None)
    if name is None:
        return
    from asymagent.modeling.pairs import PAIR_PREFIX, get_pair

    get_pair(name)  # an unknown name: ValueError listing the known ones
    if args.verifier not in ("default", PAIR_PREFIX + name):
        raise ValueError(f"--pair {name} and --verifier/--model {args.verifier!r} both name a verifier")
    args.verifier = PAIR_PREFIX + name


def check_args(args) -> None:
    """Refuse mistakes before any model loads (integrations/cli.py prints them on one line)."""
    from asymagent.integrations.engine_source import check_source

    model = getattr(args, "model", None)
    if model is not None:  # `serve MODEL`: vLLM's positional form of --model
        if args.verifier not in ("default", model):
            raise ValueError(f"the model is given twice: {model!r} and --model {args.verifier!r}")
        args.verifier = model
    use_pair(args)
    head = getattr(args, "feature_head", None)
    if head is not None and not Path(head).expanduser().is_file():
        raise FileNotFoundError(f"--feature-head: no such file: {head}")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    for flag, value, low in (("--max-queue", args.max_queue, 1), ("--max-tokens", args.max_tokens or 1, 1),
                             ("--max-sessions", args.max_sessions, 1),
                             ("--max-num-seqs", getattr(args, "max_num_seqs", None), 1),
                             ("--max-num-batched-tokens", getattr(args, "max_num_batched_tokens", None), 1),
                             ("--max-body-bytes", args.max_body_bytes, 1),
                             ("--max-model-len", args.max_model_len, 2),
                             ("--threads", args.threads, 1),
                             ("--num-speculative-tokens",
                              getattr(args, "num_speculative_tokens", None), 1)):
        if value is not None and value < low:
            raise ValueError(f"{flag} must be >= {low}, got {value}")
    if getattr(args, "trace_dir", None) is not None:
        import os

        if os.path.exists(args.trace_dir) and not os.path.isdir(args.trace_dir):
            raise ValueError(f"--trace-dir {args.trace_dir} is a file; it must be a directory (created if missing)")
        if not args.trace_max_mb > 0 or (args.trace_max_files is not None and args.trace_max_files < 1):
            raise ValueError("--trace-max-mb must be > 0 and --trace-max-files >= 1")
    if not args.request_timeout > 0:
        raise ValueError(f"--request-timeout must be > 0, got {args.request_timeout}")
    if not 0.0 <= args.temperature <= 2.0:
        raise ValueError(f"--temperature must be in 0..2, got {args.temperature}")
    if args.config:
        read_config(args.config)
    if getattr(args, "chat_template", None) is not None:
        from asymagent.context.rendering import chat_template_text

        args.chat_template = chat_template_text(args.chat_template)  # read once, before any model
    check_source(args.verifier, args.drafter, args.mode)
    resolve_device(args.device)
    if getattr(args, "suffix_store", None):
        check_suffix_store(args.suffix_store)
    for origin in args.allowed_origins or ():
        if origin != "*" and not origin.startswith(("http://", "https://")):
            raise ValueError(f"--allowed-origins: {origin!r} is not an origin "
                             "(scheme://host[:port]) or *")
    check_host(args.host)


def check_host(host: str) -> None:
    """--host is an address of this machine (or a name of one): tried by binding a socket to
    it on a free port and closing it at once, so `serve` fails before the model loads, not
    after (a port already taken is still uvicorn's error: the test would race with it)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ValueError(f"--host {host}: not an address or a known host name ({exc})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind(address)
        except OSError as exc:
            raise ValueError(f"--host {host}: cannot listen there: {exc.strerror or exc}") from None


def check_suffix_store(path: str) -> None:
    """--suffix-store: its folder must exist (the store is written after every response) and an
    existing file must be a store (numpy only: no model is read)."""
    import os

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"--suffix-store {path}: the folder {folder} does not exist")
    if os.path.exists(path):
        from asymagent.decoding.suffix_store import SuffixStore

        try:
            SuffixStore(path=path)
        except Exception as exc:  # a truncated or foreign file: numpy's own error, named
            raise ValueError(f"--suffix-store {path}: not a suffix store ({exc})") from None


def load_engine(args):
    """Engine for `asymagent serve` from --verifier/--drafter/--config/--dtype/--device
    (+ --suffix-store)."""
    from asymagent.integrations.engine_source import open_engine

    check_args(args)
    spec, compression = read_config(args.config) if args.config else (None, None)
    k = getattr(args, "num_speculative_tokens", None)
    if k is not None:
        from dataclasses import replace

        from asymagent.spec_config import SpecConfig

        spec = spec or SpecConfig()
        spec = replace(spec, k=k, k_max=max(spec.k_max, k))
    device = resolve_device(args.device)
    engine = open_engine(args.verifier, args.drafter, mode=args.mode, spec=spec,
                         compression=compression, dtype=resolve_dtype(args.dtype, device),
                         device=device, max_sessions=args.max_sessions,
                         max_num_seqs=getattr(args, "max_num_seqs", None) or 1,
                         max_num_batched_tokens=getattr(args, "max_num_batched_tokens", None) or 32)
    if getattr(args, "feature_head", None):
        engine.use_feature_head(args.feature_head)
    if getattr(args, "suffix_store", None):
        from asymagent.decoding.suffix_store import SuffixStore

        engine.suffix_store = SuffixStore(path=args.suffix_store)
    if getattr(args, "chat_template", None) is not None:
        use_chat_template(engine, args.chat_template)
    return engine


def use_chat_template(engine, template: str) -> None:
    """Give the engine's tokenizer `template` (--chat-template) and check at start that it renders
    a conversation append-stably (a ValueError naming the flag otherwise: exit 1, one line)."""
    engine.tokenizer.chat_template = template
    try:
        engine.chat_format  # built now from the new template (the first chat would build it)
    except ValueError as exc:
        raise ValueError(f"--chat-template: {exc}") from None
