"""What this CPU kind's probes find: the dtype chosen, the attention and linear row floors, the grouped path.

`python -m asymagent.evals.probes.cpu_kind [--json PATH]` prints one JSON object: torch's CPU
capability, the bf16 unit the engine uses (asymagent/modeling/cpu_dtype.py), the CPU family and
the dtype chosen (cpu_family.py), whether the packed bf16 linear kernel runs, the attention row
floor (bf16 and float32; asymagent/kv/attention.py), whether grouped rows give the per-head bits
(`grouped_rows_exact`), and the linear row floors of the embedded verifier's layer shapes (packed
kernel and F.linear) and of the reference pair's 1.5B down projection (F.linear, 1536 x 8960).
Run under an ISA cap it reports the emulated kind (`make test-cpu-kinds` runs it under each;
docs/cpu.md keeps the table); the probes' on-disk record keys the cap apart (probe_cache.py).
"""

from __future__ import annotations

import os

import torch

from asymagent.evals.probes.harness import finish, parser

# the embedded verifier's linear shapes [out, in] (q, k|v, gate|up, down) and the pair's 1.5B down
SHAPES = ((576, 576), (192, 576), (1536, 576), (576, 1536))
PAIR_DOWN = (1536, 8960)


def measure() -> dict:
    """The probes' answers on this machine, under the environment's ISA caps."""
    from asymagent.kv.attention import attention_floor, grouped_rows_exact
    from asymagent.modeling.cpu_family import cpu_choice
    from asymagent.modeling.packed_linear import kernel_available, linear_floor
    from asymagent.modeling.probe_cache import ISA_CAPS

    choice = cpu_choice()
    packed_why = kernel_available()
    linear = {}
    for shape in SHAPES:
        key = f"{shape[0]}x{shape[1]}"
        linear[key] = {"F.linear": linear_floor(torch.bfloat16, shape, packed=False)}
        if packed_why is None:
            linear[key]["packed"] = linear_floor(torch.bfloat16, shape, packed=True)
    linear[f"{PAIR_DOWN[0]}x{PAIR_DOWN[1]}"] = {"F.linear": linear_floor(torch.bfloat16, PAIR_DOWN, packed=False)}
    return {
        "caps": {name: os.environ.get(name) for name in ISA_CAPS if os.environ.get(name)},
        "threads": torch.get_num_threads(),
        "capability": choice["capability"],
        "bf16_unit": choice["bf16_unit"],
        "family": choice["family"],
        "dtype": choice["dtype"],
        "packed_kernel": packed_why or "available",
        "attention_floor": {"bfloat16": attention_floor(torch.bfloat16),
                            "float32": attention_floor(torch.float32)},
        "grouped_rows_exact": grouped_rows_exact(),
        "linear_floor_bf16": linear,
    }


def main(argv: list | None = None) -> int:
    args = parser(__doc__, "cpu_kind").parse_args(argv)
    return finish(measure(), args.json, show=True)


if __name__ == "__main__":
    raise SystemExit(main())
