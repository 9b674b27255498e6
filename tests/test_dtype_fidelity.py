"""evals/probes/dtype_fidelity.py: the comparison against float32 (no model: raw outputs given)."""

from __future__ import annotations

import pytest

from asymagent.evals.probes.dtype_fidelity import compare


def _raw():
    call = {"name": "get", "arguments": {"id": 3}}
    ref = [["records", 0, 0, call, True], ["records", 0, 1, "answer 42", True],
           ["tickets", 0, 0, call, False], ["tickets", 0, 1, "done", True]]
    bf16 = [ref[0], ["records", 0, 1, "answer 41", False], ref[2], ref[3]]
    return {"outputs": {"float32": {"full": ref}, "bfloat16": {"full": bf16}},
            "walls": {"float32": 2.0, "bfloat16": 1.0}}


def test_compare_counts_identical_steps_and_accuracy():
    table = compare(_raw(), ["float32", "bfloat16"], ["full"])
    assert table["float32/full"]["fidelity_vs_float32"] == 1.0
    assert table["float32/full"]["step_accuracy"] == 0.75
    row = table["bfloat16/full"]
    assert row["fidelity_vs_float32"] == 0.75 and row["step_accuracy"] == 0.5
    assert row["differing_steps"] == [["records", 0, 1]]


def test_compare_needs_the_float32_reference():
    raw = _raw()
    del raw["outputs"]["float32"]
    with pytest.raises(ValueError, match="reference"):
        compare(raw, ["bfloat16"], ["full"])
