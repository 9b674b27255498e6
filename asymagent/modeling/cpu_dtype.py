"""Which weight dtype fits this machine: bfloat16 where the CPU multiplies bf16 in hardware.

Measured on a 2-core AMX machine (issue 30): prefill of 1024 tokens of the embedded verifier is
2-7x faster in bfloat16 than in float32, because AMX / AVX512-BF16 units multiply bf16 at several
times the float32 rate; a CPU without them emulates bf16 and gets slower, not faster. So:

- `cpu_bf16_support()` says once per process which bf16 matrix unit the CPU has ("amx_bf16",
  "avx512_bf16") or None, from torch's own CPU feature probe (and /proc/cpuinfo's flags);
- `auto_dtype(device)` is bfloat16 on such a CPU (and on CUDA), float32 elsewhere;
- `resolve_dtype(name, device)` turns a `--dtype` value ("auto", "float32", "bfloat16",
  "float16", "int8", "int8w", "int4w") into (weights dtype, quantisation or None): "int8" is
  float32 weights whose linear layers are then quantised dynamically
  (asymagent/modeling/quantize.py); "int8w" / "int4w" are the automatic dtype's weights (bf16
  with a bf16 unit, float32 elsewhere) whose decoder linears get a weight-only int8 / int4 copy
  for decode and verify rows (asymagent/modeling/weight_only.py);
- `runtime_info(model)` is what `asymagent --version`, the engine banner and the server's
  `/version` report: the model's dtype, the automatic choice and the CPU's matrix units.

Logits and the acceptance gate stay float32 in every dtype: the engine casts the LM-head output
rows (`ModelCache.forward_logits`, `DraftHead`) before any softmax.
"""

from __future__ import annotations

import functools
import os

import torch

DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16", "int8", "int8w", "int4w")
QUANTIZED = ("int8",)  # names that are a quantisation of float32 weights, not a torch dtype
WEIGHT_ONLY = ("int8w", "int4w")  # weight-only low-bit copies over the automatic dtype's weights
CPUINFO = "/proc/cpuinfo"


def cpuinfo_field(name: str, path: str = CPUINFO) -> str | None:
    """The value of the first `name` line of /proc/cpuinfo (the first CPU's), or None."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(name):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags(path: str = CPUINFO) -> set:
    """The first CPU's flags (empty where /proc/cpuinfo is not there)."""
    return set((cpuinfo_field("flags", path) or "").split())


def cpu_model(path: str = CPUINFO) -> str | None:
    """The CPU's model name (lscpu's "Model name")."""
    return cpuinfo_field("model name", path)


def bf16_forced_off() -> bool:
    """`ASYMAGENT_CPU_BF16=0`: the bf16 unit turned off (to measure the float32 path on a bf16 machine)."""
    return os.environ.get("ASYMAGENT_CPU_BF16", "").strip().lower() in ("0", "false", "off", "no")


@functools.cache
def cpu_bf16_support() -> str | None:
    """The CPU's bf16 matrix unit ("amx_bf16" or "avx512_bf16"), or None; probed once.

    `ASYMAGENT_CPU_BF16=0` forces None (to measure the float32 path on a bf16 machine); an ISA
    cap on oneDNN (`onednn_bf16_units`) leaves out the units it forbids."""
    if bf16_forced_off():
        return None
    flags = cpu_flags()
    cpu = getattr(torch, "cpu", None)

    def probe(name: str) -> bool:
        fn = getattr(cpu, name, None)
        try:
            return bool(fn()) if fn is not None else False
        except Exception:  # noqa: BLE001 - a probe that fails means "not known to be there"
            return False

    allowed = onednn_bf16_units()
    if "amx_bf16" in allowed and ("amx_bf16" in flags or (not flags and probe("_is_amx_tile_supported"))):
        return "amx_bf16"
    if "avx512_bf16" in allowed and ("avx512_bf16" in flags or (not flags and probe("_is_avx512_bf16_supported"))):
        return "avx512_bf16"
    return None


# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) whose kernels still use AVX512-BF16 dot products but no AMX
_BF16_NO_AMX_CAPS = ("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512")


def onednn_bf16_units() -> tuple:
    """The bf16 units oneDNN may use under its ISA cap (`ONEDNN_MAX_CPU_ISA` / `DNNL_MAX_CPU_ISA`):
    both where none is set (or ALL, or an AMX cap); AVX512-BF16 only under AVX512_CORE_BF16 (an
    AMX CPU emulating one without it, `make test-cpu-kinds`); none under a lower cap (AVX2: the
    matmuls would emulate bf16, so float32 is chosen, as on an AVX2-only CPU)."""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    if not cap or cap == "ALL" or "AMX" in cap:
        return ("amx_bf16", "avx512_bf16")
    if cap in _BF16_NO_AMX_CAPS:
        return ("avx512_bf16",)
    return ()


def auto_dtype(device: str | torch.device | None = None) -> torch.dtype:
    """bfloat16 on CUDA and on a CPU with bf16 matrix units, float32 elsewhere."""
    kind = torch.device(device).type if device is not None else "cpu"
    if kind == "cuda":
        return torch.bfloat16
    if kind == "cpu" and cpu_bf16_support() is not None:
        return torch.bfloat16
    return torch.float32


def resolve_dtype(name, device: str | torch.device | None = None
                  ) -> tuple[torch.dtype, str | None]:
    """(weights dtype, quantisation) for a `--dtype` value, a torch.dtype or None (= "auto")."""
    if name is None:
        name = "auto"
    if isinstance(name, torch.dtype):
        return name, None
    name = str(name).strip().lower().removeprefix("torch.")
    if name == "auto":
        return auto_dtype(device), None
    if name in QUANTIZED:
        return torch.float32, name
    if name in WEIGHT_ONLY:
        return auto_dtype("cpu"), name
    if name in ("float32", "bfloat16", "float16"):
        return getattr(torch, name), None
    raise ValueError(f"unknown dtype {name!r}; use one of {', '.join(DTYPE_NAMES)}")


def for_device(dtype, device: str | torch.device | None = None):
    """`dtype` with "auto" / None replaced by `auto_dtype(device)` (other values unchanged)."""
    if dtype is None or (isinstance(dtype, str) and dtype.strip().lower() == "auto"):
        return auto_dtype(device)
    return dtype


def dtype_name(model: torch.nn.Module) -> str:
    """"int8" / "int8w" / "int4w" for a model with quantised linear layers, else its parameters' dtype."""
    if getattr(model, "asymagent_quantized", None):
        return str(model.asymagent_quantized)
    param = next(model.parameters(), None)
    return str(param.dtype).removeprefix("torch.") if param is not None else "unknown"


def runtime_info(model: torch.nn.Module | None = None) -> dict:
    """{"dtype" (the model's, when given), "auto_dtype", "cpu_bf16", "cpu_capability"}."""
    info = {}
    if model is not None:
        info["dtype"] = dtype_name(model)
    info["auto_dtype"] = str(auto_dtype("cpu")).removeprefix("torch.")
    info["cpu_bf16"] = cpu_bf16_support()
    try:
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - older torch
        info["cpu_capability"] = None
    return info


def describe(info: dict) -> str:
    """One line for banners: 'dtype bfloat16 (auto: bfloat16; CPU bf16 unit amx_bf16, AVX512)'."""
    unit = info.get("cpu_bf16") or "none"
    head = f"dtype {info['dtype']} " if "dtype" in info else ""
    return (f"{head}(auto: {info['auto_dtype']}; CPU bf16 unit: {unit}; "
            f"capability: {info.get('cpu_capability')})")
