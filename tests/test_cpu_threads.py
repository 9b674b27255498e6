"""The CPU thread policy (asymagent/modeling/cpu_threads.py) and family choice (cpu_family.py): threads follow the
CPUs this process may use (affinity, cgroup v2/v1 quota, faked here in a temporary cgroup tree),
and the OpenMP wait policy is set before torch is imported, never over the user's own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from asymagent.modeling import cpu_threads as ct


def cgroup_v2(tmp_path, rel: str, limits: dict):
    """A fake cgroup v2 tree: /proc/self/cgroup says "0::/rel"; limits {subpath: cpu.max text}."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "cgroup"
    proc.write_text(f"0::{rel}\n")
    root = tmp_path / "fs"
    root.mkdir()
    for sub, text in limits.items():
        d = root / sub.strip("/") if sub.strip("/") else root
        d.mkdir(parents=True, exist_ok=True)
        (d / "cpu.max").write_text(text + "\n")
    return str(root), str(proc)


def test_v2_quota_of_the_cgroup_and_its_parents(tmp_path):
    root, proc = cgroup_v2(tmp_path, "/kube/pod1/ctr", {"": "max 100000", "kube/pod1": "250000 100000",
                                                        "kube/pod1/ctr": "max 100000"})
    assert ct.cgroup_cpu_quota(root, proc) == pytest.approx(2.5)  # the parent's limit applies
    root, proc = cgroup_v2(tmp_path / "b", "/a", {"": "max 100000", "a": "150000 100000"})
    assert ct.cgroup_cpu_quota(root, proc) == pytest.approx(1.5)
    root, proc = cgroup_v2(tmp_path / "c", "/", {"": "max 100000"})
    assert ct.cgroup_cpu_quota(root, proc) is None  # "max": no limit


def test_v2_smallest_limit_wins(tmp_path):
    root, proc = cgroup_v2(tmp_path, "/a/b", {"a": "100000 100000", "a/b": "400000 100000"})
    assert ct.cgroup_cpu_quota(root, proc) == pytest.approx(1.0)


def test_v1_cfs_quota(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/docker/x\n2:cpu,cpuacct:/docker/x\n")
    d = tmp_path / "fs" / "cpu,cpuacct" / "docker" / "x"
    d.mkdir(parents=True)
    (d / "cpu.cfs_quota_us").write_text("300000\n")
    (d / "cpu.cfs_period_us").write_text("100000\n")
    assert ct.cgroup_cpu_quota(str(tmp_path / "fs"), str(proc)) == pytest.approx(3.0)
    (d / "cpu.cfs_quota_us").write_text("-1\n")  # no limit
    assert ct.cgroup_cpu_quota(str(tmp_path / "fs"), str(proc)) is None


def test_no_cgroup_files_means_no_quota(tmp_path):
    assert ct.cgroup_cpu_quota(str(tmp_path / "none"), str(tmp_path / "missing")) is None


def test_available_cpus_is_the_smaller_of_affinity_and_quota():
    assert ct.available_cpus(8, 2.5, probe=False) == 3  # a quota of 2.5 CPUs: 3 threads
    assert ct.available_cpus(2, 6.0, probe=False) == 2  # taskset to 2 cores
    assert ct.available_cpus(4, None, probe=False) == 4
    assert ct.available_cpus(4, 0.2, probe=False) == 1  # never below one
    assert ct.default_threads(share=2, cpus=5) == 2  # two replicas: each its share
    assert ct.default_threads(share=8, cpus=2) == 1


def test_available_cpus_reads_the_process_affinity(monkeypatch):
    monkeypatch.setattr(ct.os, "sched_getaffinity", lambda pid: {0, 3, 5})
    monkeypatch.setattr(ct, "cgroup_cpu_quota", lambda *a, **k: None)
    monkeypatch.setattr(ct.os, "cpu_count", lambda: 64)  # the machine's count is not the answer
    assert ct.available_cpus() == 3
    monkeypatch.setattr(ct, "cgroup_cpu_quota", lambda *a, **k: 1.2)
    assert ct.available_cpus() == 2


def test_omp_policy_never_overrides_the_user():
    env = {}
    assert ct.use_omp_policy(env, load=99.0) == {"OMP_WAIT_POLICY": "PASSIVE"}  # a busy machine
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    env = {"OMP_WAIT_POLICY": "active"}
    assert ct.use_omp_policy(env, load=99.0) == {} and env == {"OMP_WAIT_POLICY": "active"}
    env = {"GOMP_SPINCOUNT": "5000"}
    assert ct.use_omp_policy(env, load=99.0) == {} and "OMP_WAIT_POLICY" not in env


def test_omp_policy_passive_only_where_the_machine_is_busy(monkeypatch):
    monkeypatch.setattr(ct, "available_cpus", lambda *a, **k: 2)
    assert ct.busy_machine(load=2.0) and not ct.busy_machine(load=1.5)
    env = {}
    assert ct.use_omp_policy(env, load=0.3) == {} and env == {}  # quiet: libgomp's spin stays
    assert ct.use_omp_policy({ct.POLICY_ENV: "passive"}, load=0.3) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert ct.use_omp_policy({ct.POLICY_ENV: "spin"}, load=50.0) == {}
    with pytest.raises(ValueError, match="auto, passive or spin"):
        ct.use_omp_policy({ct.POLICY_ENV: "sometimes"})
    # what a started process (a Ray replica, a worker) gets: the effective policy and its threads
    assert ct.omp_env({}, threads=2) == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "2"}
    assert ct.omp_env({"GOMP_SPINCOUNT": "5000", "OMP_NUM_THREADS": "4"}, threads=1) == {
        "GOMP_SPINCOUNT": "5000", "OMP_NUM_THREADS": "4"}


def test_apply_threads_and_info():
    before = torch.get_num_threads()
    try:
        assert ct.apply_threads(1) == 1 and torch.get_num_threads() == 1
        info = ct.thread_info(requested=1)
        assert info["threads"] == 1 and info["threads_source"] == "--threads"
        assert info["available_cpus"] >= 1 and info["machine_cpus"] == os.cpu_count()
        with pytest.raises(ValueError):
            ct.apply_threads(-1)
        assert ct.apply_threads(None) == ct.default_threads()
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow  # a fresh process imports torch and every verb (tens of seconds on a busy machine)
def test_cli_sets_the_wait_policy_before_torch(tmp_path):
    """`asymagent` sets OMP_WAIT_POLICY before torch loads, and --threads reaches torch."""
    env = {k: v for k, v in os.environ.items() if k not in ct.OMP_USER_KEYS}
    env[ct.POLICY_ENV] = "passive"  # as on a busy machine ("auto" decides by the load average)
    probe = tmp_path / "probe_env.py"
    probe.write_text(
        "import os, sys\n"
        "from asymagent.integrations import cli\n"
        "import asymagent.evals.bench.bench as bench\n"
        "assert 'torch' not in sys.modules\n"
        "def fake_main(args):\n"
        "    import torch\n"
        "    print('policy', os.environ.get('OMP_WAIT_POLICY'), 'threads', torch.get_num_threads())\n"
        "    return 0\n"
        "bench.check_args = lambda args: None\n"
        "bench.main = fake_main\n"
        "sys.exit(cli.main(['bench', '--threads', '1']))\n")
    out = subprocess.run([sys.executable, str(probe)], env=env, capture_output=True, text=True,
                         cwd=str(tmp_path), timeout=900)
    assert out.returncode == 0, out.stderr
    assert "policy PASSIVE threads 1" in out.stdout
    env["OMP_WAIT_POLICY"] = "ACTIVE"  # the user's own choice stays
    out = subprocess.run([sys.executable, str(probe)], env=env, capture_output=True, text=True,
                         cwd=str(tmp_path), timeout=900)
    assert "policy ACTIVE threads 1" in out.stdout, out.stderr


def test_cpu_family_picks_by_what_the_cpu_has():
    """Each CPU family's dtype and reason (flags faked: AVX2-only, AVX-512 without and with BF16, AMX)."""
    from asymagent.modeling.cpu_family import cpu_choice, cpu_family

    avx2 = {"sse4_2", "avx", "avx2", "fma"}
    avx512 = avx2 | {"avx512f", "avx512bw", "avx512_vnni"}
    assert cpu_family(avx2, None) == "avx2"
    assert cpu_family(avx512, None) == "avx512"
    assert cpu_family(avx512 | {"avx512_bf16"}, "avx512_bf16") == "avx512_bf16"
    assert cpu_family(avx512 | {"avx512_bf16", "amx_bf16", "amx_tile"}, "amx_bf16") == "amx"
    assert cpu_family({"sse2"}, None) == "baseline"
    for flags, unit, dtype in ((avx2, None, "float32"), (avx512, None, "float32"),
                               (avx512 | {"avx512_bf16"}, "avx512_bf16", "bfloat16"),
                               (avx512 | {"amx_bf16"}, "amx_bf16", "bfloat16")):
        choice = cpu_choice(flags, unit)
        assert choice["dtype"] == dtype and choice["why"].startswith(dtype)
        assert choice["bf16_unit"] == unit


def test_cpu_choice_agrees_with_auto_dtype(monkeypatch):
    from asymagent.modeling import cpu_dtype
    from asymagent.modeling.cpu_family import cpu_choice

    cpu_dtype.cpu_bf16_support.cache_clear()
    try:
        assert cpu_choice()["dtype"] == str(cpu_dtype.auto_dtype("cpu")).removeprefix("torch.")
        monkeypatch.setenv("ASYMAGENT_CPU_BF16", "0")
        cpu_dtype.cpu_bf16_support.cache_clear()
        choice = cpu_choice()
        assert choice["dtype"] == "float32" and choice["forced_off"]
    finally:
        monkeypatch.delenv("ASYMAGENT_CPU_BF16", raising=False)
        cpu_dtype.cpu_bf16_support.cache_clear()


def _stat_file(tmp_path, busy: int, idle: int):
    path = tmp_path / "stat"
    path.write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 0 0 1 0 0 0 0 0 0\n")
    return path


def test_busy_cpus_now_reads_the_counters_over_the_interval(tmp_path, monkeypatch):
    path = _stat_file(tmp_path, busy=1000, idle=1000)
    monkeypatch.setattr(ct.os, "cpu_count", lambda: 4)

    def advance(_seconds):  # 300 busy and 100 idle ticks pass while it sleeps: 3 of 4 CPUs busy
        path.write_text(path.read_text().replace("cpu  1000 0 0 1000", "cpu  1300 0 0 1100"))

    monkeypatch.setattr(ct.time, "sleep", advance)
    assert ct.busy_cpus_now(stat=str(path)) == pytest.approx(3.0)
    assert ct.busy_cpus_now(stat=str(tmp_path / "missing")) is None


def test_a_job_started_seconds_ago_counts_though_the_load_average_lags(monkeypatch):
    monkeypatch.setattr(ct, "available_cpus", lambda *a, **k: 2)
    monkeypatch.setattr(ct.os, "getloadavg", lambda: (0.4, 0.3, 0.2))  # the average has not caught up
    monkeypatch.setattr(ct, "busy_cpus_now", lambda *a, **k: 2.0)  # two spinning threads right now
    assert ct.busy_machine()
    assert ct.use_omp_policy({}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    monkeypatch.setattr(ct, "busy_cpus_now", lambda *a, **k: 0.1)
    assert not ct.busy_machine() and ct.use_omp_policy({}) == {}
    monkeypatch.setattr(ct, "busy_cpus_now", lambda *a, **k: None)  # /proc/stat unreadable
    assert not ct.busy_machine()
