"""Model files without torch: the error for a model that is not where it was asked for, and a weights file's sha256.

Kept apart from loading.py (which imports torch, ~1-3 s) so that what only reads files (the pair
parts' check and assembly, asymagent/modeling/pairs.py; `make demo`'s memory check,
asymagent/modeling/pair_memory.py) starts without torch. loading.py re-exports both names.
"""

from __future__ import annotations

import hashlib
import os


class ModelNotFoundError(FileNotFoundError):
    """A model (or the embedded default) is not where it was asked for."""


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """sha256 of a file, streamed (the embedded GGUF is ~100 MB: ~0.3 s)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
