"""Triton kernels and their torch references (asymagent.kernels; imports nothing of ours).

`fused_gate` is the acceptance gate of docs/architecture.md §3 (delta-fusion + JSD-aware acceptance):
CUDA tensors run the Triton kernel, CPU tensors the torch reference; ASYMAGENT_GATE=triton|torch|compile
forces one. `fused_gate_reference` is the readable definition both are tested against.
"""

from asymagent.kernels.fused_gate import fused_gate, gate_backend
from asymagent.kernels.gate_reference import (
    ACCEPTANCE_RULES,
    GateNoise,
    GateResult,
    draw_gate_noise,
    fused_gate_reference,
)

__all__ = ["ACCEPTANCE_RULES", "fused_gate", "fused_gate_reference", "GateResult", "GateNoise", "draw_gate_noise",
           "gate_backend"]
