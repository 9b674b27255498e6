"""evals/probes/gpu_bench.py: refuses clearly without CUDA; its engine code runs (CPU smoke test)."""

from __future__ import annotations

import argparse

import pytest
import torch

from asymagent.evals.probes import gpu_bench


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


def test_engine_figures_on_cpu_smoke():
    # the real run is on CUDA (docs/kernels.md); here only the code path, on a tiny shape
    args = _args(["--shape", "tiny", "--prompt", "1200", "--tokens", "12", "--repeats", "1",
                  "--forwards", "3"])
    out = gpu_bench.bench_engine(args, device="cpu")
    assert out["graph_error"] is None
    for key in ("eager_forward_ms", "graph_forward_ms", "full_ms_per_token", "spec_ms_per_token",
                "asym_ms_per_token", "full_ms_per_token_eager"):
        assert out[key] > 0, key
    assert out["graphs_equal_eager_full"]  # static caches decode the same tokens (fp32 here)
    assert out["asym_view_tokens"] == 1024 and out["prompt_tokens"] == 1200
    assert "random-weight" in out["model"]
