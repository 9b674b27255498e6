"""int8 weights for the CPU: dynamic quantisation of a causal LM's decoder linear layers.

`quantize_int8(model)` replaces every `nn.Linear` inside the decoder layers with torch's
`torch.ao.nn.quantized.dynamic.Linear` (weights int8 per tensor, activations quantised per batch at run time,
int8 x int8 matmuls through fbgemm/oneDNN). Kept in float: the embeddings, the norms and the LM head
(it is tied to the embeddings in SmolLM2, the drafter shares it, and the logits the gate reads stay
float32). The model is marked `asymagent_quantized = "int8"` (what `runtime_info` reports).

This is the `--dtype int8` setting (asymagent/modeling/cpu_dtype.py). Its fidelity to float32 and
its speed are measured by `python -m asymagent.evals.dtype_fidelity` (docs/results.md); torch's
dynamic quantisation API is deprecated upstream but present in torch 2.13, and a torch without it
gives a clear error here.
"""

from __future__ import annotations

import warnings

import torch


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Quantise the decoder layers' linear layers of `model` (float32) to int8, in place."""
    try:
        from torch.ao.quantization import quantize_dynamic
    except ImportError as exc:  # pragma: no cover - torch without the deprecated API
        raise RuntimeError(f"--dtype int8 needs torch.ao.quantization.quantize_dynamic ({exc})") from exc
    param = next(model.parameters())
    if param.dtype != torch.float32 or param.device.type != "cpu":
        raise ValueError(f"int8 quantisation needs a float32 model on the CPU, got "
                         f"{param.dtype} on {param.device}")
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no model.layers to quantise")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the per-tensor quantize deprecation notice
        for i, layer in enumerate(layers):
            layers[i] = quantize_dynamic(layer, {torch.nn.Linear}, dtype=torch.qint8)
    model.asymagent_quantized = "int8"
    return model
