"""GQA-aware SDPA for multi-token decode: verify K+1 positions without copying the KV cache.

transformers' `sdpa` attention expands grouped key/value heads with `repeat_kv` whenever a
forward feeds more than one query token under a mask (the verify forward of every speculative
round, and chunked prefill on top of a cache): a full copy of every layer's keys and values, x
the group size (3 for SmolLM2), each round. `torch.nn.functional.scaled_dot_product_attention`
takes `enable_gqa=True` instead and reads the grouped heads in place; the result is the same
computation (bit-identical to the repeat_kv path on CPU in our checks) at about half the time
for a 3-token query over 2k cached positions.

`use_gqa_attention(model)` switches a model that uses `sdpa` to this function ("asymagent_sdpa"
in transformers' AttentionInterface); anything else (eager, flash, a model without grouped
heads, single-token decode, position bias) goes through transformers' own sdpa unchanged.
`python -m asymagent.evals.probes.kv_probes attention` times one verify forward, sdpa vs this.
"""

from __future__ import annotations

import functools
import inspect

import torch

ATTN_NAME = "asymagent_sdpa"
_registered = False


def gqa_sdpa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                     value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                     scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """Attention of transformers' sdpa signature; query [B, Hq, q, D], key/value [B, Hkv, S, D]."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    q_len = query.shape[2]
    one_row = q_len == 1 and _same_rows_as_batched(query, attention_mask)
    if (groups <= 1 or (q_len == 1 and not one_row) or attention_mask is None
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
            or kwargs.get("output_attentions", False)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    if one_row:  # the query twice: the kernel's multi-row path, as a verify forward takes
        query = torch.cat([query, query], dim=2)  # [B, Hq, 2, D] (contiguous, as a verify's rows)
        attention_mask = torch.cat([attention_mask, attention_mask], dim=2)  # [B, 1, 2, L]
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        enable_gqa=True)  # [B, Hq, q, D]
    if one_row:
        out = out[:, :, :1]  # [B, Hq, 1, D]
    return out.transpose(1, 2).contiguous(), None  # [B, q, Hq, D]


def _same_rows_as_batched(query: torch.Tensor, attention_mask: torch.Tensor | None) -> bool:
    """Whether a single-row (decode) forward should run as two rows, so that a position scores
    exactly as it does inside a multi-row (verify) forward: on the CPU in bf16/fp16 under a mask
    (an aligned read, asymagent/kv/growing_cache.py, or StaticKV). PyTorch's CPU attention takes a
    different path for one query row than for several, and in bf16 the row's result differs
    (measured: bit-identical for 2..40 rows over key counts that are multiples of 64, not for 1)."""
    return (attention_mask is not None and query.device.type == "cpu"
            and query.dtype in (torch.bfloat16, torch.float16) and query.shape[0] == 1)


def aligned_sdpa_mask(*args, **kwargs):
    """transformers' sdpa mask, except that it is never skipped when the keys reach past the last
    query position (an aligned read of asymagent/kv/growing_cache.py: the tail must be masked;
    skipping would let a single-token decode attend to it). Otherwise exactly `sdpa_mask`."""
    from transformers.masking_utils import sdpa_mask

    bound = _signature(sdpa_mask).bind(*args, **kwargs)
    given = bound.arguments
    if given.get("kv_offset", 0) + given["kv_length"] > given.get("q_offset", 0) + given["q_length"]:
        given["allow_is_causal_skip"] = False
    return sdpa_mask(*bound.args, **bound.kwargs)


@functools.cache
def _signature(fn) -> inspect.Signature:
    return inspect.signature(fn)  # once: the mask is built on every forward


def register() -> None:
    """Add ATTN_NAME to transformers' AttentionInterface (idempotent)."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(ATTN_NAME, gqa_sdpa_forward)
        # masks as for sdpa: without this entry transformers builds NO mask for an unknown
        # implementation, and a multi-token forward on a cache would attend wrongly
        AttentionMaskInterface.register(ATTN_NAME, aligned_sdpa_mask)
        _registered = True


def use_gqa_attention(model: torch.nn.Module) -> bool:
    """Switch `model` from sdpa to the GQA-aware sdpa; True if it switched (or already had)."""
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if impl == ATTN_NAME:
        return True
    if impl != "sdpa":
        return False
    register()
    try:
        model.set_attn_implementation(ATTN_NAME)
    except (AttributeError, ValueError, TypeError):
        return False
    return getattr(model.config, "_attn_implementation", None) == ATTN_NAME
