"""asymagent: context-asymmetric speculative decoding for long-horizon LLM agents.

Public API (DESIGN.md §4): Engine, SpecConfig, CompressionConfig, Agent, tool.
Imports are lazy so `import asymagent` stays cheap and a missing optional piece only fails
when it is used.
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "Engine": ("asymagent.engine", "Engine"),
    "SpecConfig": ("asymagent.spec_config", "SpecConfig"),
    "CompressionConfig": ("asymagent.views", "CompressionConfig"),
    "Agent": ("asymagent.agent", "Agent"),
    "tool": ("asymagent.agent", "tool"),
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
