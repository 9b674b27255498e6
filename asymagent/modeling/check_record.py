"""An on-disk record of the engine start's bit-identity checks on a loaded model's weights.

Why (issue 53: `make demo` once set up is to take <= 2 minutes): every engine start checks that
the packed kernels give each linear layer's rows F.linear's bits (`pack_linears`, 4 row counts on
each of the pair's 366 layers) and that the lean forward's logits equal transformers' (a prefill
and 1-, 4- and 40-token forwards both ways, kv/lean_forward.py). On the reference pair that was
the larger part of the start (cProfile: 85 of 132 s on a loaded machine), and its answer is the
same on every start with the same weights, machine and code. So the answer is kept beside the
row-floor probes' (probe_cache.py: `cache_dir()/probes.json`, under the CPU, its flags, torch's
build and version and the ISA caps) under a key of everything else it depends on:

- the weights: `weights_stamp.stamp(model)`, their file's sha256, the files' paths, sizes and
  mtimes, dtype and quantisation, valid only while no parameter was moved, replaced or written
  since the load (a model built or changed in memory has none: its checks run every time);
- the model's config (its JSON), the torch thread count, transformers' version;
- the code that runs both sides: a digest of asymagent/kv/ and asymagent/modeling/'s sources
  (an edit there checks again) and of every ASYMAGENT_* switch set (but the cache's own);
- what the check compares (its name and its own parameters, e.g. the packed row limit).

A changed key checks afresh (tests/test_check_record.py); `ASYMAGENT_PROBE_CACHE=0` turns the
record off (every check runs at every start, as before).
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Callable

import torch

from asymagent.modeling import probe_cache
from asymagent.modeling.weights_stamp import stamp

_NOT_KEYED = ("ASYMAGENT_CACHE_DIR", "ASYMAGENT_PROBE_CACHE")  # where the record is, whether it is read


@functools.cache
def code_stamp() -> str:
    """A digest of the sources of asymagent/kv/ and asymagent/modeling/ (the forwards, kernels,
    packing and probes both sides of a check run) and transformers' version."""
    import transformers

    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256(transformers.__version__.encode())
    for folder in ("kv", "modeling"):
        for path in sorted((root / folder).glob("*.py")):
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _switches() -> str:
    return ";".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                    if k.startswith("ASYMAGENT_") and k not in _NOT_KEYED)


def key_params(model: torch.nn.Module, *extra) -> tuple | None:
    """The record's parameters for a check on `model` (module doc), or None where the weights
    have no stamp (the check then runs and is not recorded)."""
    weights = stamp(model)
    if weights is None:
        return None
    config = getattr(model, "config", None)
    config_json = config.to_json_string(use_diff=False) if config is not None else ""
    config_digest = hashlib.sha256(config_json.encode()).hexdigest()[:16]
    digest = hashlib.sha256(_switches().encode()).hexdigest()[:16]
    return (weights, config_digest, torch.get_num_threads(), code_stamp(), digest, *extra)


def recorded_check(name: str, model: torch.nn.Module, check: Callable[[], object],
                   valid: Callable[[object], bool], *extra) -> object:
    """check()'s answer (a JSON value) for `model`: read from the record under its key when
    there, else run and recorded; run every time where `model` has no weights stamp."""
    params = key_params(model, *extra)
    if params is None:
        return check()
    return probe_cache.recorded(name, params, check, valid)
