"""A stamp of the weights a loaded model holds, valid while none of its parameters is replaced or changed in place.

Why (issue 53): the engine's start checks, bit for bit, that the packed kernels and the lean
forward give a model's weights the logits F.linear and transformers give them (packed_linear.py,
kv/lean_forward.py): ~5-10 s of every start on the reference pair, whose answer is the same on
every start with the same weights on the same machine and code. A record of that answer needs to
know "the same weights": `mark` (called by `load_model` on a model read from files) keeps the
weights' fingerprint (the GGUF's or the safetensors' sha256), the files' paths, sizes and mtimes,
the load's dtype and quantisation, and every parameter's identity (storage pointer and in-place
version counter); `stamp` gives the digest back only while each parameter is still that one (not
moved, replaced or written since the load), else None. A model built or changed in memory has no
stamp, so its checks always run.
"""

from __future__ import annotations

import hashlib
import json
import os

import torch

ATTR = "asymagent_weights_stamp"


def _identity(model: torch.nn.Module) -> tuple:
    """(name, storage pointer, version counter) of every parameter and buffer of `model`."""
    out = []
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        try:
            version = torch.Tensor._version.__get__(t)
        except RuntimeError:  # an inference tensor has no version counter
            version = -1
        out.append((name, t.data_ptr(), version))
    return tuple(out)


def mark(model: torch.nn.Module, fingerprint: str, files: list, load: str) -> None:
    """Record what `model`'s weights were loaded from: `fingerprint` (sha256 of the weights file),
    the `files` read (paths; their sizes and mtimes are taken now) and `load` (dtype and
    quantisation). Files that are not there: no stamp."""
    try:
        stats = [[str(f), os.stat(f).st_size, os.stat(f).st_mtime_ns] for f in files]
    except OSError:
        return
    if not fingerprint or not stats:
        return
    digest = hashlib.sha256(json.dumps([fingerprint, stats, load]).encode()).hexdigest()[:16]
    model.__dict__[ATTR] = (digest, _identity(model))  # not a submodule, not in the state dict


def stamp(model: torch.nn.Module) -> str | None:
    """The digest `mark` made, while every parameter is the one loaded; None otherwise."""
    marked = model.__dict__.get(ATTR)
    if marked is None:
        return None
    digest, identity = marked
    return digest if _identity(model) == identity else None
