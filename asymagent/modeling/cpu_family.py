"""Which CPU family this machine is, and what the engine picks on it and why (the bench's `machine` block).

The engine's choices follow what the CPU has (/proc/cpuinfo's flags, torch's own probes):
- `amx`: AMX tiles multiply bf16 -> bfloat16 weights (prefill 2-7x float32's, issue 30);
- `avx512_bf16`: AVX512-BF16 dot products -> bfloat16 (about twice float32's rate);
- `avx512`: AVX-512 without a bf16 unit -> float32 (bf16 would be converted op by op: slower);
- `avx2`: AVX2 only, as most laptops and many cloud VMs -> float32, for the same reason;
- `baseline`: older x86 or another architecture -> float32.
The dtype itself is `cpu_dtype.auto_dtype` (bf16 exactly where `cpu_bf16_support()` finds a unit);
the kernels are torch's: `torch.backends.cpu.get_cpu_capability()` names the vector ISA its
own kernels dispatch to, oneDNN picks AMX / AVX512-BF16 for bf16 matmuls where present; the
row floors (row_floor.py) are probed on this machine at the engine's thread count.
"""

from __future__ import annotations

from asymagent.modeling.cpu_dtype import bf16_forced_off, cpu_bf16_support, cpu_flags, cpu_model  # noqa: F401 - cpu_flags, cpu_model re-exported

FAMILIES = ("amx", "avx512_bf16", "avx512", "avx2", "baseline")
REASONS = {
    "amx": "bfloat16: AMX tiles multiply bf16 at several times the float32 rate",
    "avx512_bf16": "bfloat16: AVX512-BF16 dot products run bf16 at about twice the float32 rate",
    "avx512": "float32: AVX-512 without a bf16 unit; bf16 would be converted op by op (slower)",
    "avx2": "float32: AVX2 only, no bf16 unit; bf16 would be converted op by op (slower)",
    "baseline": "float32: no wide vector or bf16 unit found",
}


def cpu_family(flags: set, bf16_unit: str | None) -> str:
    """One of FAMILIES from the flags and the bf16 unit the engine uses (cpu_bf16_support)."""
    if bf16_unit == "amx_bf16":
        return "amx"
    if bf16_unit == "avx512_bf16":
        return "avx512_bf16"
    if "avx512f" in flags:
        return "avx512"
    if "avx2" in flags:
        return "avx2"
    return "baseline"


def cpu_choice(flags: set | None = None, bf16_unit: str | None = ...) -> dict:
    """{"cpu_model", "family", "dtype", "why", "bf16_unit", "capability", "forced_off"}: what the
    engine picks on this CPU (or on the given flags / unit) and why."""
    import torch

    flags = cpu_flags() if flags is None else flags
    unit = cpu_bf16_support() if bf16_unit is ... else bf16_unit
    family = cpu_family(flags, unit)
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - older torch
        capability = None
    if family == "avx512" and capability == "AVX2":  # ATEN_CPU_CAPABILITY=avx2 on an AVX-512 CPU:
        family = "avx2"  # its kernels are AVX2's (an emulated AVX2-only machine)
    forced = bf16_forced_off()
    why = REASONS[family]
    if forced and unit is None and family in ("avx512", "avx2", "baseline") and (
            "amx_bf16" in flags or "avx512_bf16" in flags):
        why = "float32: ASYMAGENT_CPU_BF16=0 turns the bf16 unit off"
    return {"cpu_model": cpu_model(), "family": family, "dtype": why.split(":", 1)[0],
            "why": why, "bf16_unit": unit, "capability": capability, "forced_off": forced}
