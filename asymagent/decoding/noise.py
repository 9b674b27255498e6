"""KeyedNoise: every random number of a request keyed by (seed, output position, purpose), not by draw order.

Counter-based randomness: the draw for one key comes from a fresh `torch.Generator` seeded with
a hash of the key, so how many numbers a round draws (K, adaptive K, prompt lookup, a plain step
instead of a round) never shifts any other draw. A request is identified by its seed
(`seed=None` gets a fresh random 63-bit seed, so unseeded requests get independent streams).

Purposes (docs/engine.md, "Sampling"):
- "gumbel": g_t [V], standard Gumbel noise of output position t. Every sampled token is a
  Gumbel-max: token_t = argmax(logits_t + T * g_t) (= argmax(logits_t / T + g_t), a sample of
  softmax(logits_t / T)). Plain steps, the coupled rule's target and the drafter's draft at t
  all use the same g_t, which is what makes coupled speculation equal to the verifier alone.
- "accept": u_t uniform [0, 1), acceptance="exact"'s test of the draft at position t.
- "residual": E [V] Exp(1), acceptance="exact"'s race for the one residual/bonus token of the
  round that starts at position t.
"""

from __future__ import annotations

import hashlib

import torch

from asymagent.kernels import GateNoise

PURPOSES = ("gumbel", "accept", "residual")
_TINY = torch.finfo(torch.float32).tiny  # Exp(1) draws are clamped here: log stays finite
_CACHED_ROWS = 64  # Gumbel rows kept (a round re-reads the rows its drafter drew)


def key_seed(seed: int, position: int, purpose: str) -> int:
    """The 64-bit generator seed of one draw: blake2b of (seed, position, purpose)."""
    if purpose not in PURPOSES:
        raise ValueError(f"unknown noise purpose {purpose!r}; expected one of {PURPOSES}")
    digest = hashlib.blake2b(repr((int(seed), int(position), purpose)).encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "little")


class KeyedNoise:
    """The random numbers of one request, each a pure function of (seed, position, purpose)."""

    def __init__(self, seed: int, vocab_size: int, device: torch.device | str = "cpu") -> None:
        self.seed = int(seed)
        self.vocab_size = int(vocab_size)
        self.device = torch.device(device)
        self._gumbel: dict = {}  # position -> [V] float32

    def _generator(self, position: int, purpose: str) -> torch.Generator:
        gen = torch.Generator(device=self.device)
        gen.manual_seed(key_seed(self.seed, position, purpose))
        return gen

    def _exponential(self, position: int, purpose: str) -> torch.Tensor:
        """[V] Exp(1) draws of one key (float32, clamped away from 0)."""
        out = torch.empty(self.vocab_size, dtype=torch.float32, device=self.device)
        return out.exponential_(generator=self._generator(position, purpose)).clamp_min_(_TINY)

    def gumbel(self, position: int) -> torch.Tensor:
        """g_t [V]: standard Gumbel noise of output position t (g = -log E, E ~ Exp(1))."""
        row = self._gumbel.get(position)
        if row is None:
            if len(self._gumbel) >= _CACHED_ROWS:  # positions only grow: drop the oldest
                del self._gumbel[min(self._gumbel)]
            row = self._gumbel[position] = self._exponential(position, "gumbel").log_().neg_()
        return row

    def gumbel_rows(self, start: int, count: int) -> torch.Tensor:
        """[count, V]: g_t for t = start .. start + count - 1."""
        return torch.stack([self.gumbel(start + i) for i in range(count)])

    def uniform(self, position: int) -> torch.Tensor:
        """u_t: one uniform in [0, 1) (a 0-dim float32 tensor) for the exact test at position t."""
        return torch.rand((), generator=self._generator(position, "accept"), device=self.device)

    def gate_noise(self, start: int, k: int) -> GateNoise:
        """acceptance="exact"'s noise for a round of k drafts at positions start .. start+k-1."""
        uniform = torch.stack([self.uniform(start + i) for i in range(k)]) if k else \
            torch.empty(0, device=self.device)
        return GateNoise(uniform=uniform[None], exponential=self._exponential(start, "residual")[None])
