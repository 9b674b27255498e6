"""How many CPU threads the engine uses, and how its OpenMP workers wait: the cores this process may use.

A machine's core count is not what a process gets: a container's cgroup quota, a `taskset`
affinity or a Ray replica's share all give it fewer. torch's default (one thread per core of the
machine) then puts more busy threads on the cores than there are, and torch's OpenMP workers
(GNU libgomp in the CPU wheels) spin for ~3 ms at every barrier waiting for a thread that the
scheduler has parked, at every one of a forward's many small parallel regions: beside a second
busy process a forward slowed ~10x, far more than its share (issue 44, docs/cpu.md).

- `available_cpus()`: the CPUs this process may use: its affinity (`os.sched_getaffinity`),
  capped by the cgroup CPU quota (v2 `cpu.max` of its cgroup and every parent; v1
  `cpu.cfs_quota_us / cpu.cfs_period_us`), rounded up, at least 1;
- `default_threads(share)`: `available_cpus() // share` (replicas or eval workers on one machine
  pass their count: each gets its share), at least 1;
- `omp_env(environ)`: the OpenMP variables the engine's policy sets where the user set none
  (`OMP_WAIT_POLICY=PASSIVE`: an idle worker sleeps at once instead of spinning); libgomp reads
  them once, when torch is first imported, so entry points call `use_omp_policy()` before
  importing torch (integrations/cli.py does) and hand `omp_env` to processes they start (Ray
  replicas and eval workers);
- `apply_threads(n)`: `torch.set_num_threads(n)` (None: `default_threads()`) and an inter-op
  pool of one thread (the engine issues no inter-op work);
- `thread_info()`: what was picked and why, for the bench's `machine` block and the banners.

Thread count changes which code path CPU kernels take, so the row-floor probes
(asymagent/modeling/row_floor.py) are keyed by `torch.get_num_threads()` at the time of a
forward: they always probe the count the engine runs with.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

OMP_POLICY = {"OMP_WAIT_POLICY": "PASSIVE"}  # set where the user set no wait policy of their own
OMP_USER_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")  # either means the user chose already
CGROUP_ROOT = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"


def affinity_cpus() -> int | None:
    """CPUs in this process's affinity mask (None where the OS has no such call)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cgroup_paths(proc_cgroup: str) -> dict:
    """{controller list or "": cgroup path} from /proc/self/cgroup ("0::/a/b" is the v2 entry)."""
    text = _read(Path(proc_cgroup)) or ""
    out = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            out[parts[1]] = parts[2]
    return out


def _ancestors(root: Path, rel: str) -> list:
    """root/rel and each parent of it down to root (a limit anywhere above applies too)."""
    rel = rel.strip("/")
    dirs = [root]
    if rel:
        parts = rel.split("/")
        dirs = [root.joinpath(*parts[:i]) for i in range(len(parts), 0, -1)] + [root]
    return dirs


def _v2_quota(root: Path, rel: str) -> float | None:
    """Smallest "QUOTA PERIOD" of cpu.max along the cgroup's path ("max": no limit)."""
    best = None
    for d in _ancestors(root, rel):
        text = _read(d / "cpu.max")
        if not text:
            continue
        fields = text.split()
        if fields[0] == "max":
            continue
        try:
            quota, period = float(fields[0]), float(fields[1]) if len(fields) > 1 else 100000.0
        except ValueError:
            continue
        if quota > 0 and period > 0:
            best = quota / period if best is None else min(best, quota / period)
    return best


def _v1_quota(root: Path, paths: dict) -> float | None:
    """cfs_quota_us / cfs_period_us of the cpu controller (-1: no limit)."""
    rel = next((p for k, p in paths.items() if "cpu" in k.split(",")), "/")
    best = None
    for name in ("cpu,cpuacct", "cpu", "cpuacct,cpu"):
        base = root / name
        if not base.is_dir():
            continue
        for d in _ancestors(base, rel):
            quota, period = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
            try:
                q, p = float(quota), float(period)
            except (TypeError, ValueError):
                continue
            if q > 0 and p > 0:
                best = q / p if best is None else min(best, q / p)
        if best is not None:
            return best
    return best


def cgroup_cpu_quota(root: str = CGROUP_ROOT, proc_cgroup: str = PROC_CGROUP) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (1.5 = one and a half), or None (no limit).

    cgroup v2 where /proc/self/cgroup has a "0::" entry and `root` has cpu.max files, else v1."""
    base = Path(root)
    paths = _cgroup_paths(proc_cgroup)
    if "" in paths:
        quota = _v2_quota(base, paths[""])
        if quota is not None:
            return quota
    return _v1_quota(base, paths)


def available_cpus(affinity: int | None = None, quota: float | None = None, *,
                   probe: bool = True) -> int:
    """CPUs this process may use: min(affinity, ceil(quota)), at least 1; `probe` reads the ones
    not given (tests give both and probe=False)."""
    if probe:
        affinity = affinity if affinity is not None else affinity_cpus()
        quota = quota if quota is not None else cgroup_cpu_quota()
    counts = [c for c in (affinity, math.ceil(quota) if quota else None) if c]
    if not counts:
        counts = [os.cpu_count() or 1]
    return max(1, min(counts))


def default_threads(share: int = 1, cpus: int | None = None) -> int:
    """The engine's thread count when it is one of `share` engines on this process's CPUs."""
    cpus = available_cpus() if cpus is None else cpus
    return max(1, cpus // max(1, int(share)))


def user_set_omp(environ=None) -> bool:
    """Whether the environment already names an OpenMP wait policy or spin count."""
    env = os.environ if environ is None else environ
    return any(env.get(k) for k in OMP_USER_KEYS)


def omp_env(environ=None, threads: int | None = None) -> dict:
    """The OpenMP variables a process should start with: the user's own wait policy / spin count
    where `environ` has them, else the policy's (OMP_POLICY); with `threads`, OMP_NUM_THREADS
    (the user's own where set). Handed to processes the engine starts (Ray replicas, workers)."""
    env = os.environ if environ is None else environ
    if user_set_omp(env):
        out = {k: env[k] for k in OMP_USER_KEYS if env.get(k)}
    else:
        out = dict(OMP_POLICY)
    if threads is not None:
        out["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS") or str(int(threads))
    return out


POLICY_ENV = "ASYMAGENT_OMP_POLICY"  # "auto" (default), "passive" or "spin"


PROC_STAT = "/proc/stat"
BUSY_SAMPLE_S = 0.1  # how long `busy_cpus_now` watches the machine's CPU counters


def busy_cpus_now(interval: float = BUSY_SAMPLE_S, stat: str = PROC_STAT) -> float | None:
    """How many of the machine's CPUs were busy over the next `interval` seconds (/proc/stat's
    aggregate counters: non-idle share x CPUs), or None where it cannot be read."""
    def sample() -> tuple[int, int] | None:
        text = _read(Path(stat))
        if not text or not text.startswith("cpu "):
            return None
        ticks = [int(x) for x in text.split("\n", 1)[0].split()[1:]]
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
        return sum(ticks), idle

    first = sample()
    if first is None:
        return None
    time.sleep(interval)
    second = sample()
    if second is None or second[0] <= first[0]:
        return None
    total, idle = second[0] - first[0], second[1] - first[1]
    return (total - idle) / total * (os.cpu_count() or 1)


def busy_machine(load: float | None = None, cpus: int | None = None) -> bool:
    """Whether the machine is already busy: other work at least the CPUs this process may use
    (it would take the cores our spinning workers wait for). `load` None: the larger of the
    1-minute load average and the CPUs busy right now (`busy_cpus_now`; the load average lags a
    job started seconds ago by a minute: issue 44's demo beside a just-started engine spun)."""
    cpus = cpus if cpus is not None else available_cpus()
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (OSError, AttributeError):  # no load average on this platform
            load = 0.0
        if load < cpus:  # the 0.1 s look only where the average does not already say busy
            load = max(load, busy_cpus_now() or 0.0)
    return load >= cpus


def use_omp_policy(environ=None, load: float | None = None) -> dict:
    """Set the wait policy in `environ` (os.environ) where the user set none; returns what it set.
    Takes effect only before torch is first imported (libgomp reads it then).

    `ASYMAGENT_OMP_POLICY` (in `environ`): "passive" sets PASSIVE; "spin" sets nothing (libgomp's
    spinning default); "auto" (the default) sets PASSIVE only on a machine already busy at start
    (`busy_machine(load)`). Why not always: on a quiet machine PASSIVE costs every forward a
    wake-up at each parallel region: the embedded default's bench ran 1.4x slower (full 9.1 s vs
    6.2 s, asym 3.6 s vs 2.4 s over 6 steps, A B A B, Intel AMX, 2026-12-06, docs/cpu.md); on a
    busy one spinning collapses (10x). A server started on a quiet machine that later gets
    company should be started with ASYMAGENT_OMP_POLICY=passive."""
    env = os.environ if environ is None else environ
    choice = (env.get(POLICY_ENV) or "auto").strip().lower()
    if choice not in ("auto", "passive", "spin"):
        raise ValueError(f"{POLICY_ENV} must be auto, passive or spin, got {choice!r}")
    if user_set_omp(env) or choice == "spin" or (choice == "auto" and not busy_machine(load)):
        return {}
    added = dict(OMP_POLICY)
    env.update(added)
    return added


def apply_threads(threads: int | None = None) -> int:
    """torch.set_num_threads(threads or default_threads()) and one inter-op thread; the count."""
    import torch

    n = int(threads) if threads else default_threads()
    if n < 1:
        raise ValueError(f"threads must be >= 1, got {n}")
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(1)  # only before any inter-op work has started
    except RuntimeError:
        pass
    return n


def thread_info(requested: int | None = None) -> dict:
    """What the thread policy picked and why: {"threads", "threads_source", "available_cpus",
    "machine_cpus", "affinity_cpus", "cgroup_quota_cpus", "omp_wait_policy", "gomp_spincount",
    "interop_threads"}."""
    import torch

    quota = cgroup_cpu_quota()
    avail = available_cpus(affinity_cpus(), quota, probe=False)
    threads = torch.get_num_threads()
    if requested:
        source = "--threads"
    elif threads == default_threads(cpus=avail):
        source = "available cpus (affinity and cgroup quota)"
    else:
        source = "torch's default or the caller's"
    return {"threads": threads, "threads_source": source, "available_cpus": avail,
            "machine_cpus": os.cpu_count(), "affinity_cpus": affinity_cpus(),
            "cgroup_quota_cpus": quota, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
            "interop_threads": torch.get_num_interop_threads()}
