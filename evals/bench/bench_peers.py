"""The bench's peers: stock transformers `generate` on the full context, instrumented by a hook.

- hf_generate:      `model.generate(ids, past_key_values=cache)` (greedy, full prompt), with the
                    step's `DynamicCache` carried to the next step (`PeerPrefix`), transformers'
                    documented way to continue a conversation: each step prefills only what is
                    new since the longest common prefix, as our modes do;
- hf_prompt_lookup: `generate` with `prompt_lookup_num_tokens` (n-gram drafts from the prompt);
- hf_assisted:      `generate` with `assistant_model` = our drafter with its full (shared) head.
The two speculative peers re-prefill their whole prompt every step: in transformers 5.25 their
first verify forward feeds the whole prompt even when handed a filled cache (it would duplicate
the prefix in the cache), so prefix reuse is not available to them.

A forward pre-hook on the verifier records (tokens fed T, cached tokens C) for every forward, so
each peer gets the same accounting as our modes: verifier prefill tokens, verifier FLOPs (the
formula of asymagent/decoding/flops.py) and, for the speculative peers, drafted / accepted counts.
Reconstruction per verifier forward j, with P the prompt length and e_j the tokens emitted before
it: committed_j = P + e_j; candidates c_j = C_j + T_j - committed_j; accepted a_j =
C_{j+1} - committed_j (the next forward's cache keeps the verified tokens, not the new one), and
for the last forward a = out - e_j - 1; every forward emits a_j + 1 tokens.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import torch

PEERS = ("hf_generate", "hf_prompt_lookup", "hf_assisted")


@dataclass
class PeerStep:
    token_ids: list  # new tokens (EOS kept, padding dropped)
    wall_s: float
    forwards: list = field(default_factory=list)  # [(T, C)] per verifier forward
    verifier_prefill_tokens: int = 0
    verifier_flops: float = 0.0
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0  # verifier forwards that scored at least one candidate
    accepted_by_position: list = field(default_factory=list)  # [i]: rounds accepting position i
    reached_by_position: list = field(default_factory=list)  # [i]: rounds drafting position i


class ForwardLog:
    """Context manager: records (T, C) of every forward of `model`."""

    def __init__(self, model) -> None:
        self.model, self.calls, self._handle = model, [], None

    def _hook(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        past = int(cache.get_seq_length()) if cache is not None and hasattr(cache, "get_seq_length") else 0
        if ids is not None:
            self.calls.append((int(ids.shape[-1]), past))

    def __enter__(self) -> "ForwardLog":
        self._handle = self.model.register_forward_pre_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()


def account(step: PeerStep, prompt_len: int, flops) -> PeerStep:
    """Fill prefill tokens, FLOPs and draft/accept counts from the recorded forwards."""
    emitted, out = 0, len(step.token_ids)
    step.verifier_prefill_tokens = step.forwards[0][0] if step.forwards else 0
    for j, (t, c) in enumerate(step.forwards):
        step.verifier_flops += flops.forward(t, c)
        committed = prompt_len + emitted
        cands = max(0, c + t - committed)
        if j + 1 < len(step.forwards):
            acc = step.forwards[j + 1][1] - committed
        else:
            acc = out - emitted - 1
        acc = max(0, min(cands, acc))
        if cands:
            step.rounds += 1
            step.drafted += cands
            step.accepted += acc
            for i in range(min(acc + 1, cands)):
                while len(step.reached_by_position) <= i:
                    step.reached_by_position.append(0)
                    step.accepted_by_position.append(0)
                step.reached_by_position[i] += 1
                step.accepted_by_position[i] += int(i < acc)
        emitted += acc + 1
    return step


class PeerPrefix:
    """hf_generate's KV cache carried from one bench step to the next.

    `take(prompt_ids)` crops the cache to the longest common prefix of what it holds and the new
    prompt (keeping at least one prompt token uncached, as `generate` needs one to feed), and
    `keep(ids)` records which ids the cache now covers once `generate` has filled it.
    """

    def __init__(self) -> None:
        self.cache, self.ids = None, []

    def take(self, prompt_ids: list):
        from transformers import DynamicCache

        if self.cache is None:
            self.cache, self.ids = DynamicCache(), []
            return self.cache
        common = 0
        for a, b in zip(self.ids, prompt_ids):
            if a != b:
                break
            common += 1
        drop = self.cache.get_seq_length() - min(common, len(prompt_ids) - 1)
        if drop > 0:
            self.cache.crop(-drop)  # negative: remove that many tokens (transformers 4.x and 5.x)
        self.ids = self.ids[: self.cache.get_seq_length()]
        return self.cache

    def keep(self, all_ids: list) -> None:
        self.ids = list(all_ids[: self.cache.get_seq_length()])


def run_peer(name: str, verifier, prompt_ids: list, *, max_new_tokens: int, eos_ids: list,
             pad_id: int, flops, drafter=None, prompt_lookup_tokens: int = 10,
             prefix: PeerPrefix | None = None) -> PeerStep:
    """One greedy `generate` call of peer `name` on `prompt_ids`, timed and accounted.

    `prefix` (hf_generate only) carries the KV cache between calls; None = a cold prompt."""
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r}; expected one of {PEERS}")
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=list(eos_ids),
                  pad_token_id=pad_id)
    if name == "hf_prompt_lookup":
        kwargs["prompt_lookup_num_tokens"] = prompt_lookup_tokens
    elif name == "hf_assisted":
        if drafter is None:
            raise ValueError("hf_assisted needs a drafter")
        kwargs["assistant_model"] = drafter
    if prefix is not None and name != "hf_generate":
        raise ValueError(f"{name} cannot reuse a prefix cache (see the module docstring)")
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=verifier.device)  # [1, P]
    with ForwardLog(verifier) as log, torch.inference_mode():
        t0 = time.perf_counter()
        if prefix is not None:
            kwargs["past_key_values"] = prefix.take(prompt_ids)
        with warnings.catch_warnings():
            # transformers 5.25 renames the argument to `cache` (the old name works until 6.0);
            # `past_key_values` is the one every supported version (>= 4.56) accepts
            warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated", category=FutureWarning)
            out = verifier.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)  # [1, P + n]
        wall = time.perf_counter() - t0
    if prefix is not None:
        prefix.keep(out[0].tolist())
    new = out[0, len(prompt_ids):].tolist()
    eos = set(eos_ids)
    for i, t in enumerate(new):  # keep up to and including the first EOS (as the engine does)
        if t in eos:
            new = new[: i + 1]
            break
    return account(PeerStep(new, wall, list(log.calls)), len(prompt_ids), flops)
