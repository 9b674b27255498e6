"""An on-disk record of this machine's kernel probes (row floors), so an engine start does not probe again.

Why: the row-floor probes (asymagent/modeling/row_floor.py) run each layer shape's kernel on
random weights of that shape for every candidate floor. On the reference pair's 1.5B + 0.5B
(14 linear shapes, the 151,936 x 1,536 head among them) that was 32 of an engine start's 73 s
(cProfile, 1 thread, a loaded 2-core AMX machine; docs/pair.md). A probe's answer depends only on
the kernel that runs it: this CPU (model name, flags), torch's build and version, the dtype, the
shape and the thread count. So the answer is kept in `cache_dir()/probes.json` under a key of all
of them, and read back on the next start; a different CPU, torch or thread count is a different
key, so it is probed afresh there; so is the same CPU under an ISA cap (`ONEDNN_MAX_CPU_ISA`,
`ATEN_CPU_CAPABILITY`: an emulated CPU kind never reads nor writes the real one's answers).
`ASYMAGENT_PROBE_CACHE=0` turns the record off (every probe
runs, as before).

Writes are atomic (a temporary file renamed over the old one) and merge with what other processes
wrote since this one read, so engines starting side by side at worst probe twice.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Callable

import torch

from asymagent.modeling.cache_dir import cache_dir
from asymagent.modeling.cpu_dtype import cpu_flags, cpu_model

FILE_NAME = "probes.json"
_FORMAT = 1  # bump when a probe's meaning changes (its answers are then probed afresh)


def enabled() -> bool:
    """False when ASYMAGENT_PROBE_CACHE=0."""
    return os.environ.get("ASYMAGENT_PROBE_CACHE", "").strip().lower() not in ("0", "false", "off", "no")


# the environment switches that cap the ISA torch's and oneDNN's kernels use (an emulated CPU
# kind: `make test-cpu-kinds`): the same CPU under a cap runs other kernels, so another key
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


@functools.cache
def machine_key() -> str:
    """A digest of what decides a kernel's bits here: CPU model and flags, torch's version and
    build configuration, its CPU capability (the vector ISA its kernels dispatch to), and the ISA
    caps set in the environment (ISA_CAPS; none set: the key is what it was before them)."""
    model = platform.processor() or cpu_model() or ""
    flags = " ".join(sorted(cpu_flags()))
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - an older torch: the build config still tells
        capability = ""
    parts = [str(_FORMAT), model, flags, torch.__version__, capability, torch.__config__.show()]
    parts += [f"{name}={os.environ[name]}" for name in ISA_CAPS if os.environ.get(name)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _path() -> Path:
    return cache_dir() / FILE_NAME


def _read(path: Path) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):  # none yet, or a torn/foreign file: probe afresh
        return {}


def _write(path: Path, key: str, value) -> None:
    data = _read(path)  # merge with what others wrote meanwhile
    data[key] = value
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=0, sort_keys=True)
        tmp.replace(path)
    except OSError:  # a read-only cache: the probe still answered, it is just not kept
        tmp.unlink(missing_ok=True)


def cached_probe(name: str, params: tuple, probe: Callable[[], int | bool]) -> int | bool:
    """probe()'s answer for (`name`, `params`) on this machine: read from the record when there,
    else probed and recorded. `params`: what else the answer depends on (dtype, shape, threads),
    as values whose str() is stable."""
    return recorded(name, params, probe, lambda v: isinstance(v, (bool, int)))


def recorded(name: str, params: tuple, compute: Callable[[], object], valid: Callable[[object], bool]):
    """compute()'s answer (a JSON value) for (`name`, `params`) on this machine, read back from the
    record when one there passes `valid`, else computed and recorded (asymagent/modeling/
    check_record.py keeps the start's bit-identity checks this way)."""
    if not enabled():
        return compute()
    key = "|".join([machine_key(), name, *map(str, params)])
    path = _path()
    known = _read(path).get(key)
    if known is not None and valid(known):
        return known
    value = compute()
    _write(path, key, value)
    return value
