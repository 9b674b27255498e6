"""asymagent: context-asymmetric speculative decoding for long-horizon LLM agents.

Public API (docs/architecture.md, "Contracts"): Engine, SpecConfig, CompressionConfig, Agent, tool
(plus StepStats, RunStats). Imports are lazy so `import asymagent` stays cheap and a missing
optional piece only fails when it is used. The sub-packages name the parts: decoding/, kv/,
context/, chat/, agents/, modeling/, training/ (docs/architecture.md has one line per module).
"""

from __future__ import annotations

import sys
from pathlib import Path

__version__ = "0.1.0"


def _stop_checkout_shadowing_kernels() -> None:
    """Move this checkout's root to the end of sys.path when it sits there ahead of site-packages.

    `python -m asymagent.x` run from the repository root puts the root first on sys.path, where
    our `kernels/` source folder (installed as `asymagent.kernels`) shadows the `kernels` package
    that transformers imports, and transformers fails with "cannot import name 'CUDAProperties'
    from 'kernels'". Moving the entry keeps the root importable, just after the real packages.
    """
    root = Path(__file__).resolve().parent.parent
    if not (root / "kernels" / "fused_gate.py").is_file() or "kernels" in sys.modules:
        return
    shadowing = [p for p in sys.path if Path(p or ".").resolve() == root]
    if shadowing:
        sys.path[:] = [p for p in sys.path if p not in shadowing] + shadowing


_stop_checkout_shadowing_kernels()

_LAZY = {
    "Engine": ("asymagent.engine", "Engine"),
    "SpecConfig": ("asymagent.spec_config", "SpecConfig"),
    "CompressionConfig": ("asymagent.context.compressors", "CompressionConfig"),
    "Agent": ("asymagent.agents.agent", "Agent"),
    "tool": ("asymagent.agents.tools", "tool"),
    "StepStats": ("asymagent.stats", "StepStats"),
    "RunStats": ("asymagent.stats", "RunStats"),
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'asymagent' has no attribute {name!r}")
