"""`asymagent tune` on tiny models: the grid, the interleaved search on 3 points, the time budget,
the frontier report, and the config it writes read back by the engine constructors and serve."""

from __future__ import annotations

import json

import pytest

from asymagent.config_file import engine_settings, read_config
from asymagent.context.compressors import CompressionConfig
from asymagent.evals.tuning import tune
from asymagent.spec_config import SpecConfig
from test_fusion_traces import _write


@pytest.fixture(scope="module")
def engine():
    from conftest import make_tiny_smollm_engine

    return make_tiny_smollm_engine()


def test_grid_is_one_knob_at_a_time_from_the_default():
    points = tune.grid_points(tune.DEFAULT_GRID, 100)
    assert points[0].name == "default" and points[0].spec == {} and points[0].compression is None
    names = [p.name for p in points]
    assert len(names) == len(set(names)) == 16
    by = {p.name: p for p in points}
    assert by["k=4"].spec == {"k": 4, "adaptive_k": False}
    assert by["acceptance=cda,strict_prefix=16"].spec == {"acceptance": "cda", "strict_prefix": 16}
    assert by["tool_output=128/64"].compression_config().compressors[0].tail_tokens == 64
    assert by["compression=none"].compression_config().compressors == []
    no_ids = by["id_keep_tokens=0"].compression_config().compressors[0]
    assert no_ids.id_keep_tokens == 0 and no_ids.query_keep_tokens == 96  # the rest stays the default's
    keep = [p.name for p in tune.grid_points(tune.parse_grid("id_keep_tokens=64,128;query_keep_tokens=0"), 100)]
    assert keep == ["default", "id_keep_tokens=128", "query_keep_tokens=0"]  # 64 is the default's own
    grid = tune.parse_grid("k=2,4; head_tokens=64,256 ;suffix=false,true")
    assert grid == [("k", [2, 4]), ("head_tokens", [64, 256]), ("suffix", [False, True])]
    names = [p.name for p in tune.grid_points(grid, 100)]
    # 64/32 and suffix=true are the default's own values
    assert names == ["default", "k=2", "k=4", "tool_output=256/128", "suffix=False"]
    assert len(tune.grid_points(grid, 3)) == 3
    for bad in ("nope=1", "k", "acceptance=maybe"):
        with pytest.raises(ValueError):
            tune.grid_points(tune.parse_grid(bad), 10)


def test_search_on_three_points_and_the_budget(tmp_path, engine, smollm_tokenizer):
    _write(tmp_path / "traffic", None, conversations=range(4))
    steps = tune.tune_steps(str(tmp_path / "traffic"), "all", 0.2, 3)
    assert len(steps) == 3 and steps[0].messages[:2] == steps[1].messages[:2]  # conversation order
    points = [tune.Point("default"), tune.point_for("compression", "none"), tune.point_for("k", 4)]
    res = tune.run_tune(engine, steps, points, repeats=2, group=3, max_new_tokens=6, progress=False)
    assert [r["name"] for r in res["points"]] == ["default", "compression=none", "k=4"] and not res["not_measured"]
    for r in res["points"]:
        assert r["speedup_vs_full"] > 0 and r["steps"] == 3
        lo, hi = r["speedup_vs_full_ci95"]
        assert lo <= hi
        assert 0.0 <= r["fidelity_vs_full"] <= 1.0 and 0.0 <= r["trace_match"] <= 1.0
    by = {r["name"]: r for r in res["points"]}
    # asym without compression fuses nothing (one drafter view) and the greedy gate emits the
    # verifier's argmax: token for token mode full's output
    assert by["compression=none"]["fidelity_vs_full"] == 1.0
    assert by["compression=none"]["mean_compression_ratio"] == 1.0 > by["default"]["mean_compression_ratio"]
    assert tune.choose(res["points"], 1.0)["fidelity_vs_full"] == 1.0
    assert set(tune.frontier(res["points"])) <= set(by)
    # a budget that runs out inside the first group: nothing half-measured is reported
    cut = tune.run_tune(engine, steps, points, repeats=2, group=3, max_new_tokens=6, max_minutes=1e-6,
                        progress=False)
    assert cut["points"] == [] and cut["not_measured"] == ["default", "compression=none", "k=4"]


def test_frontier_and_choice():
    rows = [{"name": n, "mode": "asym", "speedup_vs_full": s, "fidelity_vs_full": f}
            for n, s, f in (("a", 1.0, 1.0), ("b", 1.5, 0.95), ("c", 1.4, 0.9), ("d", 2.0, 0.5))]
    assert tune.frontier(rows) == ["a", "b", "d"]  # c: b is faster and more faithful
    assert tune.choose(rows, 0.9)["name"] == "b"
    assert tune.choose(rows, 0.99)["name"] == "a"
    assert tune.choose(rows, 1.0)["name"] == "a"
    assert tune.choose([dict(r, fidelity_vs_full=0.5) for r in rows], 0.9) is None


def test_cli_writes_a_config_the_engine_and_serve_load(tmp_path, engine, monkeypatch, smollm_tokenizer):
    from asymagent.engine import Engine
    from asymagent.evals.running import engine_setup
    from asymagent.integrations.cli import main
    from conftest import make_tiny_llama

    _write(tmp_path / "traffic", None, conversations=range(6))
    monkeypatch.setattr(engine_setup, "build_engine", lambda *a, **k: engine_setup.EngineSetup(
        engine, "tiny-verifier", "tiny-drafter", False))
    out, config = tmp_path / "tune.json", tmp_path / "spec.json"
    code = main(["tune", str(tmp_path / "traffic"), "--json", str(out), "--write-config", str(config),
                 "--grid", "head_tokens=128;k=4", "--max-new-tokens", "4", "--repeats", "1", "--quiet",
                 "--min-fidelity", "0.0", "--holdout", "0.5", "--max-steps", "2", "--group", "3"])
    assert code == 0
    doc = json.loads(out.read_text())
    assert [p["name"] for p in doc["points"]] == ["default", "tool_output=128/64", "k=4"]
    assert doc["slice"] == "heldout" and 1 <= doc["steps"] <= 2  # from the held-out slice
    chosen = next(p for p in doc["points"] if p["name"] == doc["chosen"])
    assert chosen["speedup_vs_full"] == max(p["speedup_vs_full"] for p in doc["points"])  # floor 0
    assert (tmp_path / "tune.md").read_text().count("| `") == 3 and (tmp_path / "tune.png").stat().st_size > 0
    spec, compression = read_config(str(config))
    point = tune.grid_points(tune.parse_grid("head_tokens=128;k=4"), 3)[[p["name"] for p in doc["points"]]
                                                                        .index(doc["chosen"])]
    assert spec == point.spec_config() and compression == point.compression_config()
    assert json.loads(config.read_text())["tuned"]["point"] == doc["chosen"]
    # the constructors and serve read the same file
    assert engine_settings(str(config)) == (spec, compression)
    assert engine_settings(str(config), spec=SpecConfig(k=7))[0].k == 7  # explicit arguments win
    model_dir = tmp_path / "tiny"
    make_tiny_llama(vocab_size=len(smollm_tokenizer), layers=1, hidden=32, heads=4, kv_heads=2).save_pretrained(model_dir)
    smollm_tokenizer.save_pretrained(model_dir)
    loaded = Engine.from_pretrained(verifier=str(model_dir), drafter=str(model_dir), config=str(config))
    assert loaded.spec == spec and loaded.compression == compression
    import argparse

    from asymagent.integrations.serve import add_arguments
    from asymagent.integrations.serve_setup import load_engine

    parser = argparse.ArgumentParser()
    add_arguments(parser)  # the serve verb's own flags, as `asymagent serve --config ...` parses them
    served = load_engine(parser.parse_args(["--config", str(config), "--verifier", str(model_dir),
                                            "--drafter", str(model_dir), "--mode", "asym",
                                            "--max-sessions", "2"]))
    assert served.spec == spec and served.compression == compression
    assert CompressionConfig.model_validate(json.loads(config.read_text())["compression"]) == compression
