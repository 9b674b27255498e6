"""Building the engine for `eval` and `bench`: the embedded default, a given drafter, or a fallback.

Order of preference for the drafter:
  1. `--drafter PATH` (a drafter saved by `asymagent train-drafter`), loaded onto the verifier;
  2. the shipped default drafter (`Engine.from_default()`);
  3. fallback while no drafter is shipped: a 2-layer drafter made of the verifier's first two
     layers, untrained, no reduced vocabulary. Its acceptance is poor; the JSON's "drafter"
     field says so, so no number is mistaken for the trained drafter's.

`EngineSpec` is the recipe (model paths and settings, never weights): what `asymagent eval
--ray` sends to each worker, which builds its own engine from it once.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from pathlib import Path


@dataclass
class EngineSetup:
    engine: object  # asymagent.engine.Engine
    verifier: str  # description for the JSON "verifier" field
    drafter: str  # description for the JSON "drafter" field
    fallback: bool  # True when the untrained fallback drafter is in use

    def describe(self) -> dict:
        """The engine fields of the eval JSON: verifier, drafter, drafter_fallback, spec."""
        return {"verifier": self.verifier, "drafter": self.drafter, "drafter_fallback": self.fallback,
                "spec": self.engine.spec.to_dict()}

    def announce(self, verb: str) -> None:
        """Print the start banner (asymagent/model_banner.py) of this engine on stderr."""
        import sys

        from asymagent.model_banner import model_banner
        from asymagent.modeling.loading import EMBEDDED_VERIFIER_ID
        from asymagent.modeling.pairs import pair_name

        pair = pair_name(self.verifier.split(": ", 1)[0])  # "pair:NAME: its description"
        source = (f"pair {pair}" if pair else "embedded default"
                  if self.verifier == EMBEDDED_VERIFIER_ID else "your models")
        banner = model_banner(self.engine, source=source, verifier=self.verifier, drafter=self.drafter)
        print(f"asymagent {verb}: models\n{banner.text()}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class EngineSpec:
    """How to build the eval engine: model names/paths and settings (a few hundred bytes).

    `verifier`: "default" or anything `load_model` takes (HF id, directory, GGUF); `drafter`: a
    drafter .safetensors path or None; `compression`: a CompressionConfig as a dict (None: the
    default). Paths must exist where the engine is built (on every Ray node)."""

    verifier: str = "default"
    drafter: str | None = None
    compression: dict | None = None
    max_sessions: int = 8
    dtype: str = "auto"  # a `--dtype` name (asymagent/modeling/cpu_dtype.py)

    def build(self) -> EngineSetup:
        from asymagent.context.views import CompressionConfig

        compression = None if self.compression is None else CompressionConfig.model_validate(self.compression)
        return build_engine(self.verifier, self.drafter, compression=compression,
                            max_sessions=self.max_sessions, dtype=self.dtype)


def build_engine(verifier: str = "default", drafter: str | None = None, *, spec=None,
                 compression=None, allow_fallback: bool = True, max_sessions: int = 8,
                 dtype="auto", compile: bool = False) -> EngineSetup:
    """The engine eval/bench run on (see module docstring). `dtype`: a torch dtype or a
    `--dtype` name (asymagent/modeling/cpu_dtype.py; the drafter follows the verifier's), "auto"
    as `Engine.from_default`;
    `compile`: Engine(compile=...) (asymagent/kv/compiled_forward.py)."""
    from asymagent.modeling.drafter import DrafterMismatchError, build_drafter, load_drafter
    from asymagent.engine import Engine
    from asymagent.modeling.loading import EMBEDDED_VERIFIER_ID, load_model

    if compression is None:
        from asymagent.context.views import CompressionConfig

        compression = CompressionConfig()
    from asymagent.modeling.pairs import default_spec_for, get_pair, pair_name, resolve_sources

    pair = pair_name(verifier)
    spec = default_spec_for(verifier, spec)  # a named pair's own default (docs/pair.md)
    if pair is not None:  # a named pair: its verifier, and its LM drafter unless --drafter is given
        ver_path, lm_drafter = resolve_sources(verifier, None)
        loaded = load_model(ver_path, dtype=dtype)
        if drafter is None:
            dra = load_model(lm_drafter, dtype=dtype).model
            return EngineSetup(Engine(loaded.model, dra, loaded.tokenizer, spec=spec, compression=compression,
                                      max_sessions=max_sessions, compile=compile,
                                      verifier_fingerprint=loaded.fingerprint),
                               f"{verifier}: {get_pair(pair).description}", f"{Path(lm_drafter).name} (the pair's LM)",
                               False)
    else:
        loaded = load_model(verifier, dtype=dtype)
    ver_desc = EMBEDDED_VERIFIER_ID if verifier in ("default", "embedded", "smollm2") else loaded.source
    if drafter is not None:
        if str(drafter).endswith(".safetensors"):  # an asymagent drafter (train-drafter)
            model = load_drafter(drafter, loaded.model)
            card = getattr(model, "asymagent_card", {}) or {}
            desc = f"{drafter} ({card.get('name') or card.get('steps', '?')} steps)" if card else str(drafter)
        else:  # a model source (a .gguf, a directory, a cached HF id): an LM drafter, as
            # Engine.from_pretrained takes it (check_drafter_source accepts both)
            model = load_model(drafter, dtype=dtype).model
            desc = f"{drafter} (an LM drafter)"
        return EngineSetup(Engine(loaded.model, model, loaded.tokenizer, spec=spec, compression=compression,
                                  max_sessions=max_sessions, compile=compile, verifier_fingerprint=loaded.fingerprint),
                           ver_desc, desc, False)
    if verifier in ("default", "embedded", "smollm2"):
        try:
            from asymagent.modeling.drafter import DEFAULT_DRAFTER_FILE, load_default_drafter

            model = load_default_drafter(loaded.model, loaded.fingerprint)
            return EngineSetup(Engine(loaded.model, model, loaded.tokenizer, spec=spec,
                                      compression=compression, max_sessions=max_sessions, compile=compile,
                                      verifier_fingerprint=loaded.fingerprint),
                               ver_desc, f"default ({DEFAULT_DRAFTER_FILE.name})", False)
        except (FileNotFoundError, DrafterMismatchError) as exc:
            if not allow_fallback:
                raise
            reason = str(exc).split(";")[0]
    else:
        reason = "no --drafter given for a non-default verifier"
    if not allow_fallback:
        raise ValueError(reason)
    model = build_drafter(loaded.model, num_layers=2, init_from_verifier=True)
    desc = (f"FALLBACK: the verifier's first 2 layers, untrained, full vocabulary ({reason}); "
            "numbers for spec/asym do not reflect a trained drafter")
    return EngineSetup(Engine(loaded.model, model, loaded.tokenizer, spec=spec, compression=compression,
                              max_sessions=max_sessions, compile=compile, verifier_fingerprint=loaded.fingerprint),
                       ver_desc, desc, True)


_SUFFIX_STORES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # engine -> {label: SuffixStore}


def use_suffix_store(engine, label: str) -> None:
    """Point `engine.suffix_store` at the store of `label` (a fresh one on first use).

    Modes compared side by side on the same steps must not copy each other's responses (mode
    full's answer to step i would be a perfect draft for asym's step i): every eval, probe and
    demo that interleaves modes gives each its own store of earlier responses."""
    from asymagent.decoding.suffix_store import SuffixStore

    stores = _SUFFIX_STORES.setdefault(engine, {})
    if label not in stores:
        stores[label] = SuffixStore()
    engine.suffix_store = stores[label]


def reset_suffix_stores(engine) -> None:
    """Empty every label's store of earlier responses (an eval episode starts with none)."""
    for store in _SUFFIX_STORES.get(engine, {}).values():
        store.clear()
