"""Tiny random models of the common decoder families (the family matrix, tests/test_families.py).

Each is made in the test from its transformers config (no download): 2 layers (Gemma 3: two local
layers and one global), 4 query heads over 2 key/value heads, the real SmolLM2 vocabulary by
default so the embedded tokenizer drives it. `window` sets the sliding window of the families
that have one (Mistral: every layer; Gemma 3: its local layers). Embeddings are scaled up (as
conftest's tiny Llama) so the logits are peaked enough for speculation to accept and reject; the
head is untied and the weights drawn wider than transformers' default (`init`), so the greedy
output is varied text, not one token repeated (a tied random head predicts the last token again).
"""

from __future__ import annotations

import torch

FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma3_text", "phi3", "granite", "olmo2")
WINDOWED = ("mistral", "gemma3_text")


def make_family(family: str, vocab: int = 49152, window: int = 16, seed: int = 0,
                layers: int = 2, embed_scale: float = 8.0, init: float = 0.1) -> torch.nn.Module:
    """A randomly initialised *ForCausalLM of `family` (float32, eval mode)."""
    import transformers as T

    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                  bos_token_id=1, eos_token_id=2, pad_token_id=2, tie_word_embeddings=False,
                  initializer_range=init)
    configs = {
        "llama": lambda: T.LlamaConfig(**common),
        "qwen2": lambda: T.Qwen2Config(**common),
        "qwen3": lambda: T.Qwen3Config(head_dim=16, **common),
        "mistral": lambda: T.MistralConfig(sliding_window=window, **common),
        "gemma3_text": lambda: T.Gemma3TextConfig(
            head_dim=16, sliding_window=window, **{**common, "num_hidden_layers": layers + 1},
            layer_types=["sliding_attention"] * layers + ["full_attention"]),
        "phi3": lambda: T.Phi3Config(**common),
        "granite": lambda: T.GraniteConfig(**common),
        "olmo2": lambda: T.Olmo2Config(**common),
    }
    torch.manual_seed(seed)
    model = T.AutoModelForCausalLM.from_config(configs[family]())
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(embed_scale)
    return model.eval()
