"""The drafter model: a 1-2 layer decoder sharing the verifier's embeddings and head.

A drafter is a `LlamaForCausalLM` of the verifier's own architecture (hidden size, heads and
vocabulary read from the verifier config) with `num_hidden_layers` = 1-2, whose
`model.embed_tokens` and `lm_head` ARE the verifier's modules (shared, frozen, tied head). Only
its decoder layers and final norm are trained and shipped. Two attributes ride along:
- `drafter.asymagent_draft_vocab`: LongTensor [N], the reduced draft vocabulary (FR-Spec: the
  N token ids the verifier predicts most often on the training corpus). The engine proposes from
  those head rows only (hidden from `drafter.model(...)`, then a linear over those rows) and uses
  the full head at the K+1 verify positions.
- `drafter.asymagent_card`: dict (verifier id and sha256, data mix, steps, measured acceptance).

Shipped file (safetensors): `model.layers.*`, `model.norm.weight`, `asymagent_draft_vocab`; the
card is a JSON file beside it. `load_default_drafter` loads the one under `asymagent/assets/`
and refuses a verifier whose fingerprint differs from the one it was trained against.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import torch

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"  # asymagent/assets
DEFAULT_DRAFTER_FILE = ASSETS_DIR / "drafter-smollm2.safetensors"
DEFAULT_CARD_FILE = ASSETS_DIR / "drafter-smollm2.card.json"
DRAFT_VOCAB_KEY = "asymagent_draft_vocab"


class DrafterMismatchError(ValueError):
    """A drafter does not fit the verifier it is being attached to."""


def card_path_for(weights: str | Path) -> Path:
    """`x.safetensors` -> `x.card.json` (the card lives beside the weights)."""
    weights = Path(weights)
    return weights.with_name(weights.name.removesuffix(".safetensors") + ".card.json")


def drafter_config(verifier_config, num_layers: int):
    """The verifier's config with `num_layers` decoder layers (everything else identical)."""
    if num_layers < 1:
        raise ValueError(f"a drafter needs at least one layer, got {num_layers}")
    if num_layers > verifier_config.num_hidden_layers:
        raise ValueError(f"drafter layers ({num_layers}) exceed the verifier's "
                         f"({verifier_config.num_hidden_layers})")
    cfg = copy.deepcopy(verifier_config)
    cfg.num_hidden_layers = num_layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = list(cfg.layer_types[:num_layers])
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    return cfg


def build_drafter(verifier, num_layers: int = 2, init_from_verifier: bool = True):
    """A drafter for `verifier` (a HF causal LM with `.model.layers`), sharing its embeddings/head.

    With `init_from_verifier`, layer i and the final norm start as copies of the verifier's
    (measured to distil much faster than random init, docs/architecture.md §5).
    """
    from transformers import AutoModelForCausalLM

    cfg = drafter_config(verifier.config, num_layers)
    # Build without the embedding/head (a 1-row vocabulary placeholder), then share the verifier's.
    small = copy.deepcopy(cfg)
    small.vocab_size, small.pad_token_id = 1, None
    drafter = AutoModelForCausalLM.from_config(small)
    drafter.config = cfg
    drafter.model.config = cfg
    drafter.model.embed_tokens = verifier.get_input_embeddings()
    drafter.lm_head = verifier.get_output_embeddings()
    with torch.no_grad():
        for i in range(num_layers):
            if init_from_verifier:
                drafter.model.layers[i].load_state_dict(verifier.model.layers[i].state_dict())
        drafter.model.norm.load_state_dict(verifier.model.norm.state_dict())
    dtype = verifier.get_input_embeddings().weight.dtype
    drafter.model.layers.to(device=verifier.device, dtype=dtype)
    drafter.model.norm.to(device=verifier.device, dtype=dtype)
    drafter.model.rotary_emb.to(device=verifier.device)
    drafter.eval()
    return drafter


def trainable_state_dict(drafter) -> dict[str, torch.Tensor]:
    """Only what a drafter owns: decoder layers and the final norm (shared tensors excluded)."""
    return {k: v for k, v in drafter.state_dict().items()
            if k.startswith(("model.layers.", "model.norm."))}


def trainable_parameters(drafter) -> list[torch.nn.Parameter]:
    return list(drafter.model.layers.parameters()) + list(drafter.model.norm.parameters())


def save_drafter(drafter, path: str | Path, draft_vocab: torch.Tensor, card: dict | None = None,
                 dtype: torch.dtype = torch.float16) -> Path:
    """Write `path` (safetensors: layers + norm + draft vocab) and its card beside it."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in trainable_state_dict(drafter).items()}
    tensors[DRAFT_VOCAB_KEY] = draft_vocab.detach().to("cpu", torch.long).contiguous()
    save_file(tensors, str(path), metadata={"format": "asymagent-drafter-1"})
    if card is not None:
        card_path_for(path).write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")
    return path


def load_drafter(path: str | Path, verifier_model):
    """Load a saved drafter onto `verifier_model` (shared embeddings/head) -> LlamaForCausalLM.

    Sets `asymagent_draft_vocab` (LongTensor [N]) and `asymagent_card` (dict, {} without card).
    """
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"drafter weights not found: {path}")
    tensors = load_file(str(path))
    if DRAFT_VOCAB_KEY not in tensors:
        raise DrafterMismatchError(f"{path} has no {DRAFT_VOCAB_KEY!r} tensor: not an asymagent drafter")
    draft_vocab = tensors.pop(DRAFT_VOCAB_KEY).long()
    layer_ids = {int(k.split(".")[2]) for k in tensors if k.startswith("model.layers.")}
    if not layer_ids or layer_ids != set(range(len(layer_ids))):
        raise DrafterMismatchError(f"{path} has no contiguous decoder layers (found {sorted(layer_ids)})")
    cfg = verifier_model.config
    q = tensors.get("model.layers.0.self_attn.q_proj.weight")
    if q is None or q.shape[1] != cfg.hidden_size:
        raise DrafterMismatchError(
            f"drafter hidden size {None if q is None else q.shape[1]} != verifier hidden size {cfg.hidden_size}")
    if len(draft_vocab) == 0 or int(draft_vocab.max()) >= cfg.vocab_size or int(draft_vocab.min()) < 0:
        raise DrafterMismatchError(f"draft vocabulary ids fall outside the verifier vocabulary ({cfg.vocab_size})")
    drafter = build_drafter(verifier_model, num_layers=len(layer_ids), init_from_verifier=False)
    dtype = verifier_model.get_input_embeddings().weight.dtype
    missing, unexpected = drafter.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, strict=False)
    own_missing = [k for k in missing if k.startswith(("model.layers.", "model.norm."))]
    if own_missing or unexpected:
        raise DrafterMismatchError(f"drafter weights do not fit: missing {own_missing}, unexpected {unexpected}")
    for p in trainable_parameters(drafter):
        p.requires_grad_(False)
    drafter.asymagent_draft_vocab = draft_vocab.to(verifier_model.device)
    card_file = card_path_for(path)
    drafter.asymagent_card = json.loads(card_file.read_text()) if card_file.is_file() else {}
    drafter.eval()
    return drafter


@functools.lru_cache(maxsize=1)
def embedded_verifier_sha256() -> str:
    """sha256 of the embedded GGUF (computed once per process, ~0.3 s)."""
    from asymagent.modeling.loading import file_sha256, find_embedded_gguf

    return file_sha256(find_embedded_gguf())


def load_default_drafter(verifier_model, verifier_fingerprint: str | None = None):
    """The shipped drafter for the embedded SmolLM2 verifier, fingerprint-checked.

    `verifier_fingerprint` is `LoadedModel.fingerprint` (sha256 of the GGUF the verifier came
    from); without it the embedded GGUF is hashed. A missing asset or a different verifier is a
    clear error rather than a silently useless drafter.
    """
    if not DEFAULT_DRAFTER_FILE.is_file() or not DEFAULT_CARD_FILE.is_file():
        raise FileNotFoundError(
            f"the default drafter is missing ({DEFAULT_DRAFTER_FILE} and its card); train one with "
            "`asymagent train-drafter --verifier default --out DIR` and export it there")
    card = json.loads(DEFAULT_CARD_FILE.read_text())
    expected = card.get("verifier_sha256")
    actual = verifier_fingerprint or embedded_verifier_sha256()
    if expected != actual:
        raise DrafterMismatchError(
            f"the default drafter was trained against verifier sha256 {expected}, but this verifier's "
            f"fingerprint is {actual}; load the embedded SmolLM2 verifier or train a drafter for yours")
    return load_drafter(DEFAULT_DRAFTER_FILE, verifier_model)


def install_default(weights: Path) -> Path:
    """Copy a trained drafter and its card to where `load_default_drafter` looks."""
    import shutil

    from asymagent.modeling.loading import file_sha256, find_embedded_gguf

    card = json.loads(card_path_for(weights).read_text())
    if card.get("verifier_sha256") != file_sha256(find_embedded_gguf()):
        raise ValueError("--install is only for drafters trained against the embedded verifier")
    DEFAULT_DRAFTER_FILE.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(weights, DEFAULT_DRAFTER_FILE)
    shutil.copyfile(card_path_for(weights), DEFAULT_CARD_FILE)
    return DEFAULT_DRAFTER_FILE
