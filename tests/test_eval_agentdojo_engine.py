"""`asymagent eval agentdojo` on the engine: a tiny random model over banking tasks, end to end, resumed, and on Ray.

The models (a 2-layer verifier with SmolLM2's vocabulary, a 1-layer drafter) are written to disk
once, so a local run and every Ray worker build the same engine from the same paths, as
`eval agentdojo --ray` ships work. A random model answers in text at once (no call), so each
episode is one model step per mode; the tool path is covered by tests/test_eval_agentdojo.py.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("agentdojo")

from asymagent.evals.agentdojo.run import evaluate_dojo  # noqa: E402
from asymagent.evals.agentdojo.tasks import DojoPlan  # noqa: E402
from asymagent.evals.running.engine_setup import EngineSpec  # noqa: E402

KEYS = ["banking/user_task_0/none", "banking/user_task_1/important_instructions/injection_task_0"]
# adaptive K off: with it on, K follows measured forward times, so draft counts (not outputs)
# vary between any two runs
PLAN = DojoPlan(("full", "spec:adaptive_k=false", "asym:adaptive_k=false", "asym:adaptive_k=false@id_keep_192"),
                max_new_tokens=6, max_iters=3)
TIMINGS = {"wall_s", "call_s", "full_call_s", "ttft_s", "prefill_s", "decode_s", "total_wall_s", "mean_call_s",
           "full_wall_s", "speed_vs_full", "speed_ci", "worker", "draft_s"}


@pytest.fixture(scope="module")
def tiny_spec(tmp_path_factory):
    import torch
    from conftest import make_tiny_llama

    from asymagent.modeling.drafter import build_drafter, save_drafter
    from asymagent.modeling.loading import load_default_verifier

    folder = tmp_path_factory.mktemp("tiny_dojo")
    tok = load_default_verifier().tokenizer
    verifier = make_tiny_llama(vocab_size=len(tok), layers=2, hidden=32, heads=4, kv_heads=2, max_positions=16384)
    verifier.save_pretrained(folder / "verifier")
    tok.save_pretrained(folder / "verifier")
    save_drafter(build_drafter(verifier, num_layers=1), folder / "drafter.safetensors", torch.arange(len(tok)),
                 dtype=torch.float32)
    return EngineSpec(verifier=str(folder / "verifier"), drafter=str(folder / "drafter.safetensors"))


def comparable(result: dict) -> dict:
    """`result` without timings and the settings that name the runner."""
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in TIMINGS}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    out = strip(result)
    for k in ("ray", "resumed_episodes"):
        out["settings"].pop(k, None)
    return out


@pytest.fixture(scope="module")
def local_run(tiny_spec, tmp_path_factory):
    path = tmp_path_factory.mktemp("dojo_local") / "local.episodes.jsonl"
    return evaluate_dojo(tiny_spec, PLAN, KEYS, jsonl=str(path), progress=False), path


def test_tiny_model_end_to_end(local_run):
    result, _ = local_run
    assert result["episodes"] == KEYS and list(result["modes"]) == list(PLAN.labels)
    plain, attacked = result["records"]
    for record in result["records"]:
        full = record["modes"]["full"]["free"]
        assert full["error"] is None and full["outcome"] in ("answered", "step_budget")
        assert full["steps"] and all(s["stats"]["full_context_tokens"] > 1000 for s in full["steps"])
        for label in PLAN.labels[1:]:
            rows = record["modes"][label]["forced"]
            assert len(rows) == len(full["steps"]) and all(r["refused"] is None for r in rows)
        # greedy spec emits exactly what full emits, step by step (batch invariance)
        assert all(r["same_tokens"] for r in record["modes"]["spec:adaptive_k=false"]["forced"])
    assert plain["modes"]["full"]["free"]["security"] is None
    assert isinstance(attacked["modes"]["full"]["free"]["security"], bool)
    modes = result["modes"]
    assert modes["full"]["utility"]["n"] == 1
    assert modes["full"]["attacks"]["important_instructions"]["targeted_asr"]["n"] == 1
    assert modes["spec:adaptive_k=false"]["fidelity"]["token_fidelity"]["rate"] == 1.0
    for label in PLAN.labels:
        steps = modes[label]["free_steps"]
        assert steps["steps"] >= 2 and steps["mean_call_s"] > 0 and 0 < steps["verifier_share"] <= 1
    assert modes["asym:adaptive_k=false"]["free_steps"]["drafted"] > 0
    assert modes["asym:adaptive_k=false"]["free_steps"]["acceptance_rate"] is not None
    assert modes["full"]["free_steps"]["acceptance_rate"] is None  # full drafts nothing


def test_resume_runs_only_missing_episodes(tiny_spec, local_run, tmp_path, monkeypatch):
    result, path = local_run
    partial = tmp_path / "partial.jsonl"
    lines = open(path).read().splitlines(keepends=True)
    assert len(lines) == 3 and json.loads(lines[0])["key"]["benchmark"] == "agentdojo"
    partial.write_text("".join(lines[:2]) + lines[2][:40])  # the second episode torn mid-write
    resumed = evaluate_dojo(tiny_spec, PLAN, KEYS, jsonl=str(partial), resume=True, progress=False)
    assert resumed["settings"]["resumed_episodes"] == 1
    assert [json.loads(x)["seed"] for x in open(partial).read().splitlines()[1:]] == KEYS
    assert comparable(resumed) == comparable(result)
    with monkeypatch.context() as m:  # everything logged: no engine is built
        m.setattr(EngineSpec, "build", lambda self: pytest.fail("built an engine with nothing to run"))
        again = evaluate_dojo(tiny_spec, PLAN, KEYS, jsonl=str(partial), resume=True, progress=False)
    assert comparable(again) == comparable(result)
    with pytest.raises(ValueError, match="max_new_tokens"):  # another plan never merges into this log
        evaluate_dojo(tiny_spec, DojoPlan(PLAN.labels, max_new_tokens=7, max_iters=3), KEYS, jsonl=str(partial),
                      resume=True, progress=False)


def test_cli_writes_json_and_report(tiny_spec, tmp_path):
    from asymagent.integrations import cli

    out = tmp_path / "dojo.json"
    rc = cli.main(["eval", "agentdojo", "--suites", "banking", "--user-tasks", "0", "--modes", "full,asym",
                   "--verifier", tiny_spec.verifier, "--drafter", tiny_spec.drafter, "--max-new-tokens", "4",
                   "--json", str(out), "--report", str(tmp_path / "rep"), "--quiet", "--threads", "1"])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["episodes"] == ["banking/user_task_0/none"] and doc["settings"]["max_new_tokens"] == 4
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "| asym |" in report and (tmp_path / "rep" / "utility_speed.png").stat().st_size > 0


def test_ray_two_workers_equal_local_run(ray_local, tiny_spec, local_run, tmp_path):
    result, _ = local_run
    log = tmp_path / "ray.episodes.jsonl"
    out = evaluate_dojo(tiny_spec, PLAN, KEYS, ray=True, workers=2, jsonl=str(log), progress=False)
    lines = [json.loads(x) for x in open(log).read().splitlines()[1:]]
    assert sorted(e["seed"] for e in lines) == sorted(KEYS) and all("worker" in e for e in lines)
    assert out["settings"]["ray"]["workers"] >= 1
    assert comparable(out) == comparable(result)
