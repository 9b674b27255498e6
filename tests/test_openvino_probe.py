"""The OpenVINO probe's own parts (evals/probes/openvino_decode.py): the export folder it writes,
the engine runner it times, and a real OpenVINO run where the runtime and an IR are at hand."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from asymagent.evals.probes import openvino_decode as probe
from conftest import make_tiny_llama


def test_write_hf_adds_the_transformers4_rope_key(tmp_path):
    model = make_tiny_llama()
    model.config.rope_parameters = {"rope_type": "default", "rope_theta": 12345.0}
    probe.write_hf(str(tmp_path), model=model)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["rope_theta"] == 12345.0
    assert config["rope_parameters"]["rope_theta"] == 12345.0
    assert (tmp_path / "model.safetensors").exists()


def test_engine_runner_appends_as_one_forward():
    """The runner feeds a context, an appended block and single tokens into one cache: each
    returned row is the logits a single float32 forward gives at that position."""
    from conftest import make_tiny_smollm_engine

    engine = make_tiny_smollm_engine()
    runner = probe.EngineRunner(engine)
    ids = list(range(300, 300 + 40))
    times, rows = probe._one_repeat(runner, ids[:25], ids[25:37], ids[37:])
    assert set(times) == {"prefill_s", "append_s", "decode_ms"} and times["decode_ms"] > 0
    at = [24, 36, 37, 38, 39]
    want = probe._reference(engine.verifier, ids, at)  # [5, V]
    got = np.stack(rows)
    assert got.shape == want.shape
    assert np.abs(got - want).max() < 1e-3
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_main_needs_an_ir():
    with pytest.raises(SystemExit):
        probe.main([])


@pytest.mark.skipif(probe.available() is not None or not os.environ.get("ASYMAGENT_OPENVINO_IR"),
                    reason="needs openvino and ASYMAGENT_OPENVINO_IR (an optimum-intel export of the embedded verifier)")
def test_openvino_runner_on_a_real_ir():
    runner = probe.OpenVinoRunner(os.environ["ASYMAGENT_OPENVINO_IR"], threads=torch.get_num_threads(),
                                  kv_precision="bf16")
    a = runner.feed(list(range(100, 164)))
    runner.reset()
    b = runner.feed(list(range(100, 164)))
    assert runner.held == 64 and a.shape == b.shape and np.array_equal(a, b)  # reset is a fresh state
