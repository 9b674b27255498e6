"""FLOPs of a decoder forward pass, from the model config (docs/architecture.md §6).

Formula (per forward that feeds T new tokens after C cached tokens):

    flops = 2 * N_non_embedding * T  +  4 * L * d_attn * (T*C + T*(T+1)/2)

- `2 * N_non_embedding * T`: every non-embedding weight is used in one multiply-add per token
  (Kaplan et al. 2020 convention: the input embedding lookup and the output head are
  excluded; the head is the same for every mode we compare, so ratios are unaffected).
- attention: token i of the T new ones (absolute position C+i, i = 1..T) attends to C+i keys;
  QK^T and AV each cost 2 * d_attn multiply-adds per (query, key) pair and layer, where
  d_attn = num_attention_heads * head_dim. Summed over the T queries: T*C + T(T+1)/2 pairs.
"""

from __future__ import annotations

from dataclasses import dataclass


def _get(config, name: str, default=None):
    value = getattr(config, name, None)
    return default if value is None else value


def non_embedding_params(config) -> int:
    """Non-embedding parameter count of a Llama-shaped decoder, from its config.

    Per layer: q and o projections (H x d_attn each), k and v projections (H x d_kv each), a gated
    MLP (3 x H x I), two RMSNorm weight vectors (2H); plus the final norm (H).
    """
    hidden = int(_get(config, "hidden_size"))
    layers = int(_get(config, "num_hidden_layers"))
    heads = int(_get(config, "num_attention_heads"))
    kv_heads = int(_get(config, "num_key_value_heads", heads))
    head_dim = int(_get(config, "head_dim", hidden // heads))
    inter = int(_get(config, "intermediate_size", 4 * hidden))
    d_attn, d_kv = heads * head_dim, kv_heads * head_dim
    per_layer = 2 * hidden * d_attn + 2 * hidden * d_kv + 3 * hidden * inter + 2 * hidden
    return layers * per_layer + hidden


def attention_dim(config) -> int:
    """num_attention_heads * head_dim (the width of QK^T and AV)."""
    hidden = int(_get(config, "hidden_size"))
    heads = int(_get(config, "num_attention_heads"))
    return heads * int(_get(config, "head_dim", hidden // heads))


@dataclass
class FlopCounter:
    """Forward-pass FLOPs for one model config; `forward(T, C)` applies the module formula."""

    n_non_embedding: int
    layers: int
    d_attn: int

    @classmethod
    def from_config(cls, config) -> "FlopCounter":
        return cls(non_embedding_params(config), int(config.num_hidden_layers), attention_dim(config))

    def forward(self, new_tokens: int, context_before: int) -> float:
        """FLOPs of feeding `new_tokens` tokens on top of `context_before` cached tokens."""
        if new_tokens < 0 or context_before < 0:
            raise ValueError("new_tokens and context_before must be >= 0")
        t, c = new_tokens, context_before
        dense = 2.0 * self.n_non_embedding * t
        attention = 4.0 * self.layers * self.d_attn * (t * c + t * (t + 1) / 2.0)
        return dense + attention
