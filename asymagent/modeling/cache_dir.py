"""The user cache directory: dequantised weights, assembled pairs, the kernel probes' record."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """User cache for dequantised weights: $ASYMAGENT_CACHE_DIR or ~/.cache/asymagent."""
    root = os.environ.get("ASYMAGENT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "asymagent"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path
