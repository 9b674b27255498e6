"""A GGUF's quantised weights as `--dtype int4w` takes them: Q4_K's own 4-bit grid, and which layers the file keeps above 4 bits.

Why: a GGUF model loads through transformers as float weights (each block dequantised,
asymagent/modeling/loading.py), and int4w re-quantises those floats with min/max per 32 inputs
(asymagent/modeling/weight_only.py). For a Q4_K block that is a second, different rounding: Q4_K
stores per 32 weights a scale `d * sc` and a min `dmin * m` (6-bit factors of two fp16 numbers
per 256 weights) and a 4-bit q, and a sub-block's q rarely spans all of 0..15, so min/max puts
a new grid over the old one. Measured on the reference pair's 1.5B: top-1 agreement with bf16
0.953 (docs/cpu.md). Reading the blocks instead gives the file's weights exactly: w = scale * q
+ lo per 32 inputs, which is the int4 kernel's own form (weight_only.LowBitWeight.from_grid).
And Q4_K_M keeps some layers in more bits (Q6_K for half the 1.5B's attn_v and ffn_down, Q5_0 /
Q8_0 in the 0.5B): 4 bits there would lose what llama.cpp keeps, so int4w gives them int8.

Which file tensor a model layer came from is found by value, not by name: a fingerprint (rows 0
and N-1 dequantised by the `gguf` package, cast to the model's dtype) picks the candidate, then
the whole grid dequantised in float32 exactly as `gguf` does (d * sc * q - dmin * m) must equal
the layer's weight bit for bit. A layer the loader transformed (llama's q/k rows are permuted
on load), or any other mismatch, is reported as not found and keeps min/max int4.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

Q4K_GROUP = 32  # inputs per Q4_K scale/min (a 256-weight block holds 8 of them)
Q4K_BLOCK_BYTES = 144  # fp16 d, fp16 dmin, 12 bytes of 6-bit factors, 128 bytes of 4-bit q
# kept above 4 bits by the file: int4w gives these layers int8 (module doc)
ABOVE_4_BITS = ("Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "Q8_1", "Q8_K", "F16", "BF16", "F32")


@dataclass
class Q4KGrid:
    """4-bit weights as w = scale * q + lo per group of inputs: a Q4_K tensor's (groups of 32), or
    int4w's min/max rounding of a float weight (weight_only.LowBitWeight.make)."""

    q: torch.Tensor  # [N, K] int32 in 0..15
    scale: torch.Tensor  # [N, K / group] float32 (Q4_K: d * sc)
    lo: torch.Tensor  # [N, K / group] float32, the value of q = 0 (Q4_K: -dmin * m)

    def dequantized(self) -> torch.Tensor:
        """[N, K] float32 of a Q4_K grid, the same float32 arithmetic as gguf's dequantisation."""
        n, k = self.q.shape
        qg = self.q.view(n, k // Q4K_GROUP, Q4K_GROUP).to(torch.float32)  # [N, G, 32]
        return (self.scale[..., None] * qg - (-self.lo)[..., None]).view(n, k)


def _q4k_grid(data: np.ndarray, n_out: int, n_in: int) -> Q4KGrid:
    """The grid of a Q4_K tensor's raw rows (`data` [N, K / 256 * 144] uint8)."""
    from gguf.quants import Q4_K

    blocks = data.reshape(-1, Q4K_BLOCK_BYTES)  # [B, 144], B = N * K / 256
    nb = blocks.shape[0]
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # [B, 1]
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)  # [B, 1]
    sc, m = Q4_K.get_scale_min(blocks[:, 4:16].copy())  # [B, 8] each
    scale = d * sc.astype(np.float32)  # [B, 8]
    dm = dmin * m.astype(np.float32)  # [B, 8]
    qs = blocks[:, 16:].reshape(nb, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    q = (qs & np.uint8(0x0F)).reshape(nb, 8, 32)  # [B, 8, 32]: sub-block 2i + h is byte row i, nibble h
    return Q4KGrid(torch.from_numpy(q.reshape(n_out, n_in).astype(np.int32)),
                   torch.from_numpy(np.ascontiguousarray(scale.reshape(n_out, n_in // Q4K_GROUP))),
                   torch.from_numpy(np.ascontiguousarray(-dm.reshape(n_out, n_in // Q4K_GROUP))))


def _bytes(t: torch.Tensor) -> bytes:
    """The raw bytes of a float tensor (numpy has no bf16)."""
    return t.contiguous().view(torch.uint8).numpy().tobytes()


@dataclass
class FileWeight:
    """What the GGUF holds for one model layer: its tensor name and quantisation type."""

    name: str
    type_name: str  # "Q4_K", "Q6_K", ...
    grid: Q4KGrid | None = None  # Q4_K only, when its dequantisation equals the layer's weight


class GgufBlocks:
    """The 2-D quantised tensors of a GGUF file, found by a model layer's weight (module doc)."""

    def __init__(self, path: str | Path):
        from gguf import GGUFReader

        self.path = Path(path)
        self.reader = GGUFReader(str(self.path))
        self._by_key: dict = {}  # (shape, fingerprint bytes) -> reader tensor, filled per dtype
        self._dtypes: set = set()

    @staticmethod
    def _shape(t) -> tuple:
        return (int(t.shape[1]), int(t.shape[0]))  # gguf lists [in, out]; torch's weight is [out, in]

    def _index(self, dtype: torch.dtype) -> None:
        from gguf.quants import dequantize

        for t in self.reader.tensors:
            if len(t.shape) == 2:
                rows = torch.from_numpy(np.ascontiguousarray(dequantize(t.data[[0, -1]], t.tensor_type)))  # [2, K]
                self._by_key.setdefault((self._shape(t), _bytes(rows.to(dtype))), t)
        self._dtypes.add(dtype)

    def find(self, weight: torch.Tensor) -> FileWeight | None:
        """The file's tensor behind `weight` [N, K] (float, as loaded), or None."""
        if weight.dtype not in self._dtypes:
            self._index(weight.dtype)
        t = self._by_key.get((tuple(weight.shape), _bytes(weight.detach()[[0, -1]])))
        if t is None:
            return None
        found = FileWeight(t.name, t.tensor_type.name)
        if found.type_name == "Q4_K" and weight.shape[1] % 256 == 0:
            grid = _q4k_grid(np.asarray(t.data), *weight.shape)
            if torch.equal(grid.dequantized().to(weight.dtype), weight.detach()):
                found.grid = grid
        return found
