"""evals/probes/gpu_bench.py and scripts/gpu_check.sh: refuse clearly without CUDA; their code runs on CPU."""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess

import pytest
import torch

from asymagent.evals.probes import gpu_bench

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _args(argv):
    parser = argparse.ArgumentParser()
    gpu_bench.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_refuses_without_cuda(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert gpu_bench.main(_args(["--json", str(out)])) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_gpu_check_script_exits_cleanly_without_cuda(tmp_path):
    proc = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={"OUT": str(tmp_path), "PATH": "/usr/bin:/bin",
                                                       "HOME": str(tmp_path)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no CUDA device here" in proc.stdout
    report = json.loads((tmp_path / "gpu.json").read_text())
    assert report["steps"] == [{"step": "cuda", "rc": 2, "seconds": 0, "timed_out": False,
                                "skipped": False}]


def test_engine_figures_on_cpu_smoke(tmp_path):
    # the real run is on CUDA (docs/kernels.md); here only the code path, on a tiny shape
    args = _args(["--shape", "tiny", "--prompt", "300", "--tokens", "12", "--repeats", "1",
                  "--forwards", "2", "--modes", "full_eager", "full", "spec", "asym"])
    sink = gpu_bench.Sink(str(tmp_path / "part.json"), {})
    out = gpu_bench.bench_engine(args, device="cpu", sink=sink)
    assert out["graph_error"] is None and "errors" not in sink.report
    for key in ("eager_forward_ms", "graph_forward_ms", "full_ms_per_token", "spec_ms_per_token",
                "asym_ms_per_token", "full_ms_per_token_eager", "spec_acceptance_per_token"):
        assert out[key] > 0, key
    assert 0.4 < out["drafter_agreement"] < 0.95  # the calibrated head noise (target 0.70)
    assert out["full_eager_tokens_equal_full"] and out["spec_tokens_equal_full"]  # greedy, fp32
    assert out["asym_view_tokens"] == 556 and out["prompt_tokens"] == 300
    assert json.loads((tmp_path / "part.json").read_text())["engine"]["repeats_done"] == 1


def test_merge_names_what_is_missing(tmp_path):
    good = tmp_path / "a.json"
    good.write_text(json.dumps({"engine": {"shape": "tiny", "full_ms_per_token": 1.0},
                                "errors": {"engine.spec": "boom"}}))
    bad = tmp_path / "b.json"
    bad.write_text("{not json")
    report = gpu_bench.merge([str(good), str(bad)], str(tmp_path / "gpu.json"))
    assert report["engine"]["tiny"]["full_ms_per_token"] == 1.0
    assert "a.json:engine.spec" in report["errors"] and "b.json" in report["errors"]
