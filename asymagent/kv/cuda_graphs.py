"""GraphSet: CUDA graphs of one StaticKV's forwards, one per (tokens T, head or body), replayed.

A decode step of a small model is bound by kernel launches, not by the GPU (docs/kernels.md):
a CUDA graph records the whole forward once and replays it with a single launch. The engine's
forwards have few shapes: 1 token (a plain step, a drafter step, the drafter's bonus row) and
K+1 tokens (the verify forward, the base pass), each with the head (logits) or without it (the
drafter's body: its head runs separately, on the draft vocabulary). A graph is captured on the
first forward of each (T, head) and keyed by it; it reads its input ids from a static buffer and
writes its output into a static tensor, which the next replay overwrites (StaticKV.run copies).

Capture follows torch.cuda.graphs' recipe: one warm-up forward on a side stream (lazy cuBLAS and
allocator state), the cache's length put back (the warm-up wrote K/V past it, which the mask
hides and the next forward overwrites), then the capture, which records and runs nothing. A graph
holds the StaticKV's buffer addresses, so StaticKV drops its GraphSet when it reallocates.
"""

from __future__ import annotations

import torch


class GraphSet:
    """The captured forwards of one StaticKV (asymagent/kv/static_cache.py)."""

    def __init__(self, kv) -> None:
        self.kv = kv
        self.graphs: dict = {}  # (T, head) -> (CUDAGraph, static ids [1, T], static output)

    def __len__(self) -> int:
        return len(self.graphs)

    def replay(self, cpu_ids: torch.Tensor, head: bool) -> torch.Tensor:
        """Run the graph for `cpu_ids` [1, T] (captured now if new); its static output tensor."""
        key = (int(cpu_ids.shape[1]), bool(head))
        if key not in self.graphs:
            self.graphs[key] = self._capture(*key)
        graph, ids, out = self.graphs[key]
        ids.copy_(cpu_ids)  # [1, T]
        graph.replay()
        return out

    def _capture(self, tokens: int, head: bool) -> tuple:
        kv = self.kv
        ids = torch.zeros((1, tokens), dtype=torch.long, device=kv.device)  # static input
        current = torch.cuda.current_stream(kv.device)
        side = torch.cuda.Stream(device=kv.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            kv.step(ids, head)  # warm-up; writes past the cached length, which is put back
            kv.length.fill_(kv.seen)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = kv.step(ids, head)  # recorded, not run: the length is unchanged
        return graph, ids, out


CAPTURE_ERRORS: list = []  # why CapturedCall captures failed in this process (each reason once)
# Tests on CPU: an uncaptured call's first run is preceded by what a capture does to the caches
# (a warm-up run, then the lengths put back to the host mirrors), so state bugs of the capture
# path show up without a GPU.
EMULATE_CAPTURE = False


class CapturedCall:
    """Any static-shape device function over StaticKVs (a whole speculative round), as one graph.

    `fn(**inputs)` must do device work only (no host sync, no data-dependent Python branch) and
    return tensors; `kvs` are the StaticKVs it feeds (their device lengths move on inside it).
    With `capture` (CUDA) the first call copies the inputs into static buffers on `device`, warms
    up on a side stream (the lengths are put back to the host mirrors afterwards), records the
    graph and replays it; later calls copy the inputs (host tensors too: asynchronously, no sync)
    and replay. Without `capture` (CPU) `fn` runs eagerly on the inputs moved to `device`: the
    same code, which is what the CPU tests pin. The outputs of a replay are overwritten by the
    next one: read them (one device->host copy) before calling again.
    """

    def __init__(self, fn, kvs: list, capture: bool, device: torch.device) -> None:
        self.fn, self.kvs, self.capture = fn, list(kvs), bool(capture)
        self.device = torch.device(device)
        self.inputs: dict | None = None  # name -> static input buffer (CUDA)
        self.graph = None
        self.out = None
        self.emulated = False

    def __call__(self, **inputs):
        if not self.capture:
            moved = {name: None if v is None else v.to(self.device) for name, v in inputs.items()}
            if EMULATE_CAPTURE and not self.emulated:  # the capture's warm-up and length reset
                self.emulated = True
                self.fn(**moved)
                for kv in self.kvs:
                    kv.length.fill_(kv.seen)
            return self.fn(**moved)
        if self.graph is None:
            try:
                self._record(inputs)
            except Exception as exc:  # a capture failure must not take decoding down
                self.failed(exc)
                return self(**inputs)
        for name, value in inputs.items():
            if value is not None:
                self.inputs[name].copy_(value, non_blocking=True)
        self.graph.replay()
        return self.out

    def failed(self, exc: Exception) -> None:
        """Run eagerly from now on (the same code, no graph), with the caches' lengths put back
        and the reason kept in CAPTURE_ERRORS (benches report it) and warned once."""
        import warnings

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        for kv in self.kvs:
            kv.length.fill_(kv.seen)
        self.capture, self.graph, self.inputs = False, None, None
        reason = f"{type(exc).__name__}: {exc}"[:500]
        if reason not in CAPTURE_ERRORS:
            CAPTURE_ERRORS.append(reason)
            warnings.warn(f"CUDA graph capture failed, running this call eagerly: {reason}")

    def _record(self, inputs: dict) -> None:
        self.inputs = {name: None if v is None else v.to(self.device, copy=True)
                       for name, v in inputs.items()}
        device = self.device
        current = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device=device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            self.fn(**self.inputs)  # warm-up: lazy cuBLAS / Triton compiles, outside the capture
            for kv in self.kvs:
                kv.length.fill_(kv.seen)  # the warm-up wrote past the lengths: put them back
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.out = self.fn(**self.inputs)  # recorded, not run
        self.graph = graph
