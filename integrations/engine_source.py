"""The Engine a face opens from user-facing names (`asymagent serve`, `ChatAsymSpec(model=...)`).

verifier: "default" (the embedded SmolLM2-135M-Instruct), a model directory, a .gguf file or a
cached HF id. drafter: None (the shipped drafter of the embedded verifier; none for any other),
a drafter directory/.gguf/HF id, a `.safetensors` from `asymagent train-drafter`, or "layers:N"
(an untrained drafter made of the verifier's first N layers). `check_source` refuses what cannot
work before anything loads (N past the verifier's layer count too: read from its config.json or
its GGUF header, `verifier_layers`); `open_engine` loads.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

DEFAULT_NAMES = ("default", "embedded", "smollm2")
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
                 12: "d"}  # GGUF metadata value types -> struct formats (8: string, 9: array)


def _gguf_block_count(path: Path) -> int | None:
    """`<arch>.block_count` from a GGUF file's metadata header (no tensor is read); None if the
    header does not hold it."""
    with open(path, "rb") as f:
        def read(fmt: str):
            size = struct.calcsize("<" + fmt)
            return struct.unpack("<" + fmt, f.read(size))[0]

        def skip(kind: int) -> None:
            if kind == 8:
                f.seek(read("Q"), 1)
            elif kind == 9:
                elem, count = read("I"), read("Q")
                if elem in _GGUF_SCALARS:
                    f.seek(struct.calcsize("<" + _GGUF_SCALARS[elem]) * count, 1)
                else:
                    for _ in range(count):
                        skip(elem)
            else:
                read(_GGUF_SCALARS[kind])

        if f.read(4) != b"GGUF" or read("I") < 2:
            return None
        read("Q")  # tensor count
        for _ in range(read("Q")):  # metadata key/value pairs
            key = f.read(read("Q")).decode("utf-8", "replace")
            kind = read("I")
            if key.endswith(".block_count") and kind in _GGUF_SCALARS:
                return int(read(_GGUF_SCALARS[kind]))
            skip(kind)
    return None


def verifier_layers(verifier: str) -> int | None:
    """The verifier's decoder layer count without loading it (None when it cannot be read)."""
    from asymagent.modeling.loading import find_embedded_gguf

    try:
        if verifier in DEFAULT_NAMES:
            return _gguf_block_count(find_embedded_gguf())
        path = Path(verifier).expanduser()
        if path.suffix == ".gguf":
            return _gguf_block_count(path)
        if path.is_dir():
            if (path / "config.json").is_file():
                config = json.loads((path / "config.json").read_text())
                return int(config.get("num_hidden_layers") or config.get("n_layer") or 0) or None
            ggufs = sorted(path.glob("*.gguf"))
            return _gguf_block_count(ggufs[0]) if len(ggufs) == 1 else None
    except (OSError, ValueError, struct.error):
        return None
    return None  # an HF id: its config is in the cache, read when it loads


def check_source(verifier: str, drafter: str | None, mode: str = "asym") -> None:
    """Refuse a verifier/drafter pair that cannot work, reading no weights: a ValueError or
    ModelNotFoundError (an OSError) naming the argument."""
    from asymagent.modeling.loading import check_drafter_source, check_model_source
    from asymagent.modeling.pairs import check_pair, pair_name

    if pair_name(verifier) is not None:  # "pair:NAME": its parts installed (PairNotInstalledError)
        check_pair(pair_name(verifier))
        if drafter is not None and not drafter.startswith("layers:"):
            check_drafter_source(drafter)
        return
    check_model_source(verifier)
    if drafter is not None and drafter.startswith("layers:"):
        n = drafter.split(":", 1)[1]
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"--drafter layers:N needs an integer N >= 1, got {drafter!r}")
        layers = verifier_layers(verifier)
        if layers is not None and int(n) > layers:
            raise ValueError(f"--drafter {drafter}: the verifier {verifier} has {layers} layers; "
                             f"use layers:1 .. layers:{layers}")
    elif drafter is not None:
        check_drafter_source(drafter)
    elif verifier not in DEFAULT_NAMES and mode in ("spec", "asym"):
        raise ValueError(f"the verifier {verifier} has no drafter, but the mode is {mode!r}: "
                         "pass a drafter (--drafter / drafter=: a trained one, or layers:N for "
                         "an untrained cut of the verifier) or use mode full/compressed")


def open_engine(verifier: str = "default", drafter: str | None = None, *, mode: str = "asym",
                spec=None, compression=None, dtype=None, device: str | None = None,
                max_sessions: int = 8, max_num_seqs: int = 1, max_num_batched_tokens: int = 32):
    """Load the Engine for `verifier` + `drafter` (see the module docstring); `max_num_seqs` /
    `max_num_batched_tokens`: continuous batching (Engine's, asymagent/scheduling/)."""
    from asymagent.context.views import CompressionConfig
    from asymagent.engine import Engine

    check_source(verifier, drafter, mode)
    dtype = dtype or "auto"  # bf16 where the CPU has bf16 matrix units (modeling/cpu_dtype.py)
    device = None if device in (None, "cpu") else device
    extra = {k: v for k, v in (("spec", spec), ("compression", compression)) if v is not None}
    if drafter is not None and drafter.startswith("layers:"):
        # An untrained drafter made of the verifier's first N layers (sharing its embeddings
        # and head): speculation works without a trained drafter, at lower acceptance.
        from asymagent.modeling.drafter import build_drafter
        from asymagent.modeling.loading import load_model
        from asymagent.modeling.pairs import verifier_path

        ver = load_model(verifier_path(verifier), dtype=dtype)
        if device is not None:
            ver.model.to(device)
        draft = build_drafter(ver.model, num_layers=int(drafter.split(":", 1)[1]),
                              init_from_verifier=True).eval()
        return Engine(verifier=ver.model, drafter=draft, tokenizer=ver.tokenizer, spec=spec,
                      verifier_fingerprint=ver.fingerprint,
                      compression=compression or CompressionConfig(), max_sessions=max_sessions,
                      max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)
    if verifier in DEFAULT_NAMES and drafter is None:
        return Engine.from_default(**extra, dtype=dtype, device=device, max_sessions=max_sessions,
                                   max_num_seqs=max_num_seqs,
                                   max_num_batched_tokens=max_num_batched_tokens)
    return Engine.from_pretrained(verifier=verifier, drafter=drafter, dtype=dtype, device=device,
                                  max_sessions=max_sessions, max_num_seqs=max_num_seqs,
                                  max_num_batched_tokens=max_num_batched_tokens, **extra)
