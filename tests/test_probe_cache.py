"""The on-disk record of kernel probes: read back, keyed by machine and parameters, off on request."""

from __future__ import annotations

import json

import pytest
import torch

from asymagent.modeling import probe_cache
from asymagent.modeling.packed_linear import _probe_linear_floor, enabled, linear_floor


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ASYMAGENT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ASYMAGENT_PROBE_CACHE", raising=False)
    return tmp_path / probe_cache.FILE_NAME


def counting(value):
    calls = []

    def probe():
        calls.append(1)
        return value
    return probe, calls


def test_probe_runs_once_then_is_read_back(cache):
    probe, calls = counting(4)
    assert probe_cache.cached_probe("t", (torch.bfloat16, (8, 16), 2), probe) == 4
    assert probe_cache.cached_probe("t", (torch.bfloat16, (8, 16), 2), probe) == 4
    assert len(calls) == 1
    data = json.loads(cache.read_text())
    assert list(data.values()) == [4]
    assert next(iter(data)).startswith(probe_cache.machine_key() + "|t|torch.bfloat16|(8, 16)|2")


def test_other_parameters_probe_again(cache):
    probe, calls = counting(True)
    assert probe_cache.cached_probe("t", (1,), probe) is True
    assert probe_cache.cached_probe("t", (2,), probe) is True  # another thread count
    assert probe_cache.cached_probe("u", (1,), probe) is True  # another probe
    assert len(calls) == 3
    assert len(json.loads(cache.read_text())) == 3


def test_off_probes_every_time(cache, monkeypatch):
    monkeypatch.setenv("ASYMAGENT_PROBE_CACHE", "0")
    probe, calls = counting(2)
    probe_cache.cached_probe("t", (1,), probe)
    probe_cache.cached_probe("t", (1,), probe)
    assert len(calls) == 2 and not cache.exists()


def test_a_torn_file_is_probed_afresh(cache):
    cache.write_text("{not json")
    probe, calls = counting(1)
    assert probe_cache.cached_probe("t", (1,), probe) == 1
    assert len(calls) == 1 and len(json.loads(cache.read_text())) == 1


def test_a_foreign_value_is_probed_afresh(cache):
    probe_cache.cached_probe("t", (1,), lambda: 2)
    key = next(iter(json.loads(cache.read_text())))
    cache.write_text(json.dumps({key: "two"}))
    assert probe_cache.cached_probe("t", (1,), lambda: 3) == 3


def test_recorded_linear_floor_is_the_probed_one(cache):
    """The floor the engine reads back is the floor the kernel gives on a fresh probe."""
    shape, threads = (96, 80), torch.get_num_threads()
    packed = enabled()
    fresh = _probe_linear_floor(torch.bfloat16, shape, packed)
    linear_floor(torch.bfloat16, shape, threads)  # probed (or read) and recorded
    key = "|".join([probe_cache.machine_key(), "linear_floor",
                    str(torch.bfloat16), str(shape), str(threads), str(packed)])
    recorded = json.loads(cache.read_text()).get(key) if cache.exists() else None
    if recorded is None:  # this process had probed the shape before the fixture's cache dir
        pytest.skip("the floor was in the in-process cache already")
    assert recorded == fresh


def test_an_isa_cap_is_another_machine(monkeypatch):
    """An emulated CPU kind (ONEDNN_MAX_CPU_ISA / ATEN_CPU_CAPABILITY set, `make test-cpu-kinds`)
    gets its own key: it never reads nor overwrites the real kernels' answers; unset, the key is
    the one recorded before the caps were part of it."""
    for name in probe_cache.ISA_CAPS:
        monkeypatch.delenv(name, raising=False)
    probe_cache.machine_key.cache_clear()
    plain = probe_cache.machine_key()
    keys = {plain}
    for name, value in (("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16"), ("ONEDNN_MAX_CPU_ISA", "AVX2"),
                        ("ATEN_CPU_CAPABILITY", "avx2")):
        monkeypatch.setenv(name, value)
        probe_cache.machine_key.cache_clear()
        keys.add(probe_cache.machine_key())
        monkeypatch.delenv(name)
    probe_cache.machine_key.cache_clear()
    again = probe_cache.machine_key()
    monkeypatch.undo()  # this session's own caps back, and its key with them
    probe_cache.machine_key.cache_clear()
    assert len(keys) == 4 and again == plain
