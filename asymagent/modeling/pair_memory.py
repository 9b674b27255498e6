"""Whether this machine has the memory to run a named model pair (the demo's choice between the pair and the embedded default).

`fits(name)` compares the pair's `memory_bytes` (ModelPair, measured) with the memory the kernel
says is available now (/proc/meminfo's MemAvailable; where that is unreadable, the pair is
assumed to fit). `python -m asymagent.modeling.pair_memory NAME` prints the comparison in one line
and exits 0 when the pair fits, 1 when it does not (`make demo` sets the pair up only then).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

MEMINFO = "/proc/meminfo"


@dataclass(frozen=True)
class MemoryFit:
    """The pair's need, the machine's available memory (None: unknown) and the verdict."""

    name: str
    need: int
    available: int | None

    @property
    def fits(self) -> bool:
        return self.available is None or self.available >= self.need

    def line(self) -> str:
        need = f"the pair {self.name} needs about {self.need / 1e9:.0f} GB of RAM"
        if self.available is None:
            return f"{need}; this machine's available memory is unknown (assumed enough)"
        verdict = "enough" if self.fits else "not enough"
        return f"{need}; this machine has {self.available / 1e9:.1f} GB available: {verdict}"


def available_bytes(path: str = MEMINFO) -> int | None:
    """MemAvailable in bytes, or None where the file or the field is missing."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    parts = line.split()
                    return int(parts[1]) * (1024 if len(parts) < 3 or parts[2] == "kB" else 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_fit(name: str, available: int | None = ..., path: str = MEMINFO) -> MemoryFit:
    """The MemoryFit of pair `name` (a ValueError for an unknown name) on this machine."""
    from asymagent.modeling.pairs import get_pair

    pair = get_pair(name)
    return MemoryFit(pair.name, pair.memory_bytes,
                     available_bytes(path) if available is ... else available)


def main(argv: list | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    fit = memory_fit(argv[0] if argv else "qwen2.5-coder")
    print(fit.line(), flush=True)
    return 0 if fit.fits else 1


if __name__ == "__main__":
    raise SystemExit(main())
