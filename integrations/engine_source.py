"""The Engine a face opens from user-facing names (`asymagent serve`, `ChatAsymSpec(model=...)`).

verifier: "default" (the embedded SmolLM2-135M-Instruct), a model directory, a .gguf file or a
cached HF id. drafter: None (the shipped drafter of the embedded verifier; none for any other),
a drafter directory/.gguf/HF id, a `.safetensors` from `asymagent train-drafter`, or "layers:N"
(an untrained drafter made of the verifier's first N layers). `check_source` refuses what cannot
work before anything loads; `open_engine` loads.
"""

from __future__ import annotations

DEFAULT_NAMES = ("default", "embedded", "smollm2")


def check_source(verifier: str, drafter: str | None, mode: str = "asym") -> None:
    """Refuse a verifier/drafter pair that cannot work, reading no weights: a ValueError or
    ModelNotFoundError (an OSError) naming the argument."""
    from asymagent.modeling.loading import check_drafter_source, check_model_source

    check_model_source(verifier)
    if drafter is not None and drafter.startswith("layers:"):
        n = drafter.split(":", 1)[1]
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"--drafter layers:N needs an integer N >= 1, got {drafter!r}")
    elif drafter is not None:
        check_drafter_source(drafter)
    elif verifier not in DEFAULT_NAMES and mode in ("spec", "asym"):
        raise ValueError(f"the verifier {verifier} has no drafter, but the mode is {mode!r}: "
                         "pass a drafter (--drafter / drafter=: a trained one, or layers:N for "
                         "an untrained cut of the verifier) or use mode full/compressed")


def open_engine(verifier: str = "default", drafter: str | None = None, *, mode: str = "asym",
                spec=None, compression=None, dtype=None, device: str | None = None,
                max_sessions: int = 8):
    """Load the Engine for `verifier` + `drafter` (see the module docstring)."""
    import torch

    from asymagent.context.views import CompressionConfig
    from asymagent.engine import Engine

    check_source(verifier, drafter, mode)
    dtype = dtype or torch.float32
    device = None if device in (None, "cpu") else device
    extra = {k: v for k, v in (("spec", spec), ("compression", compression)) if v is not None}
    if drafter is not None and drafter.startswith("layers:"):
        # An untrained drafter made of the verifier's first N layers (sharing its embeddings
        # and head): speculation works without a trained drafter, at lower acceptance.
        from asymagent.modeling.drafter import build_drafter
        from asymagent.modeling.loading import load_model

        ver = load_model(verifier, dtype=dtype)
        if device is not None:
            ver.model.to(device)
        draft = build_drafter(ver.model, num_layers=int(drafter.split(":", 1)[1]),
                              init_from_verifier=True).eval()
        return Engine(verifier=ver.model, drafter=draft, tokenizer=ver.tokenizer, spec=spec,
                      verifier_fingerprint=ver.fingerprint,
                      compression=compression or CompressionConfig(), max_sessions=max_sessions)
    if verifier in DEFAULT_NAMES and drafter is None:
        return Engine.from_default(**extra, dtype=dtype, device=device, max_sessions=max_sessions)
    return Engine.from_pretrained(verifier=verifier, drafter=drafter, dtype=dtype, device=device,
                                  max_sessions=max_sessions, **extra)
