"""Episodes as work units: the episode log (stream + resume) and `eval --ray` against a local run.

Tiny random models are written to disk once (a verifier directory and a drafter .safetensors), so
the local run and every Ray worker build the same engine from the same paths, exactly the way
`asymagent eval --ray` ships work (docs/evals.md, "Ray"). Ray tests start `ray.init(num_cpus=2)`
on this machine and are skipped when Ray is not installed (`pip install 'asymagent[ray]'`; the
dev extra includes it, so CI runs them).
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from asymagent.evals.running.cli import evaluate
from asymagent.evals.running.engine_setup import EngineSpec

SEEDS = [0, 1, 2]
# adaptive K off for spec/asym: with it on, K follows measured forward times, so draft counts
# (not outputs) vary between any two runs, local ones included; "asym" keeps the default
LABELS = ["full", "compressed", "spec:adaptive_k=false", "asym:adaptive_k=false", "asym"]
RUN = dict(max_steps=2, max_new_tokens=8)
TIMINGS = {"wall_s", "free_running_wall_s", "per_step_s", "cumulative_latency_s", "ttft_s", "prefill_s",
           "decode_s", "call_s", "total_wall_s", "draft_s"}
# counts that depend on the K adaptive K picked (so on timings) in the default "asym" label
ADAPTIVE = {"drafted", "accepted", "acceptance_rate", "mean_accepted_len", "acceptance_by_position",
            "reached_by_position", "rounds", "lookup_rounds", "k", "mean_jsd", "verifier_flops",
            "drafter_prefill_tokens"}


@pytest.fixture(scope="module")
def tiny_spec(tmp_path_factory):
    """EngineSpec over a random 2-layer verifier (SmolLM2 vocabulary) and a 1-layer drafter on disk."""
    import torch
    from conftest import make_tiny_llama

    from asymagent.modeling.drafter import build_drafter, save_drafter
    from asymagent.modeling.loading import load_default_verifier

    folder = tmp_path_factory.mktemp("tiny_models")
    tok = load_default_verifier().tokenizer
    verifier = make_tiny_llama(vocab_size=len(tok), layers=2, hidden=32, heads=4, kv_heads=2,
                               max_positions=16384)
    verifier.save_pretrained(folder / "verifier")
    tok.save_pretrained(folder / "verifier")
    drafter = build_drafter(verifier, num_layers=1)
    save_drafter(drafter, folder / "drafter.safetensors", torch.arange(len(tok)), dtype=torch.float32)
    return EngineSpec(verifier=str(folder / "verifier"), drafter=str(folder / "drafter.safetensors"))


def comparable(result: dict) -> dict:
    """`result` without timings, settings that name the runner, and adaptive-K counts of "asym"."""
    def strip(x, adaptive: bool):
        if isinstance(x, dict):
            return {k: strip(v, adaptive) for k, v in x.items()
                    if k not in TIMINGS and not (adaptive and k in ADAPTIVE)}
        if isinstance(x, list):
            return [strip(v, adaptive) for v in x]
        return x

    out = strip({k: v for k, v in result.items() if k not in ("modes", "per_step", "settings")}, False)
    out["settings"] = strip({k: v for k, v in result["settings"].items()
                             if k not in ("ray", "resumed_episodes")}, False)
    for key in ("modes", "per_step"):
        out[key] = {label: strip(v, label == "asym") for label, v in result[key].items()}
    return out


def log_lines(path) -> list:
    return [json.loads(line) for line in open(path)]


@pytest.fixture(scope="module")
def local_result(tiny_spec, tmp_path_factory):
    """The reference: a local run over SEEDS, streaming its episode log."""
    path = tmp_path_factory.mktemp("local") / "local.episodes.jsonl"
    result = evaluate(tiny_spec, "records", LABELS, SEEDS, jsonl=str(path), progress=False, **RUN)
    return result, path


def test_local_log_streams_and_resume_skips_written_episodes(tiny_spec, local_result, tmp_path, monkeypatch):
    result, path = local_result
    header, *episodes = log_lines(path)
    assert header["key"]["suite"] == "records" and header["key"]["engine"]["verifier"] == tiny_spec.verifier
    assert [e["seed"] for e in episodes] == SEEDS
    assert list(episodes[0]["modes"]) == LABELS  # full first, every mode in one episode
    assert result["settings"]["resumed_episodes"] == 0 and result["settings"]["ray"] is None
    assert result["drafter"].startswith(tiny_spec.drafter) and result["drafter_fallback"] is False

    # a run that died after seed 1, tearing the line of seed 2 mid-write, resumed
    partial = tmp_path / "partial.jsonl"
    text = open(path).read().splitlines(keepends=True)
    partial.write_text("".join(text[:3]) + text[3][:50])
    resumed = evaluate(tiny_spec, "records", LABELS, SEEDS, jsonl=str(partial), resume=True,
                       progress=False, **RUN)
    assert resumed["settings"]["resumed_episodes"] == 2
    assert [e["seed"] for e in log_lines(partial)[1:]] == SEEDS  # torn line cut, seed 2 appended
    assert comparable(resumed) == comparable(result)

    # everything written: nothing runs, no engine is built, same JSON
    with monkeypatch.context() as m:
        m.setattr(EngineSpec, "build", lambda self: pytest.fail("built an engine with nothing to run"))
        again = evaluate(tiny_spec, "records", LABELS, SEEDS, jsonl=str(partial), resume=True,
                         progress=False, **RUN)
    assert again["settings"]["resumed_episodes"] == 3 and comparable(again) == comparable(result)

    with pytest.raises(FileExistsError, match="--resume"):  # never overwrite a log silently
        evaluate(tiny_spec, "records", LABELS, SEEDS, jsonl=str(partial), progress=False, **RUN)
    with pytest.raises(ValueError, match="max_new_tokens"):  # never merge other settings
        evaluate(tiny_spec, "records", LABELS, SEEDS, jsonl=str(partial), resume=True, progress=False,
                 max_steps=2, max_new_tokens=9)


def test_eval_ray_without_ray_is_one_line(monkeypatch, capsys, tiny_spec):
    from asymagent.integrations import cli

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["eval", "records", "--ray", "--quiet", "--verifier", tiny_spec.verifier,
                  "--drafter", tiny_spec.drafter, "--max-steps", "1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err == ("asymagent eval: error: --ray needs Ray, which is not installed: "
                   "pip install 'asymagent[ray]'\n")


def test_episode_flags_are_checked_before_any_model_loads(tmp_path):
    import argparse

    from asymagent.evals.running import cli

    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    traces = tmp_path / "t.jsonl"
    traces.write_text("")
    for argv, message in [([str(traces), "--ray"], "suite episodes"),
                          (["fusion", "--resume", "--jsonl", "x.jsonl"], "suite episodes"),
                          (["records", "--resume"], "--resume needs the episode log"),
                          (["records", "--ray", "--workers", "0"], "--workers"),
                          (["records", "--worker-cpus", "0"], "--worker-cpus")]:
        with pytest.raises(ValueError, match=message):
            cli.check_episode_args(p.parse_args(argv))
    assert cli.log_path(p.parse_args(["records", "--ray", "--json", "runs/r.json"])) == "runs/r.episodes.jsonl"
    assert cli.log_path(p.parse_args(["records", "--json", "runs/r.json"])) is None  # local: only --jsonl


# ------------------------------------------------------------------------------------ Ray
def test_ray_run_equals_local_run(ray_local, tiny_spec, local_result, tmp_path):
    """Two actors; the log already holds seed 0 (resume), Ray runs seeds 1 and 2; the merged JSON
    equals the local run's in everything but timings, and the report renders from it."""
    from asymagent.evals.bench.report import write_eval_report

    result, path = local_result
    log = tmp_path / "ray.episodes.jsonl"
    log.write_text("".join(open(path).read().splitlines(keepends=True)[:2]))  # header + seed 0
    out = evaluate(tiny_spec, "records", LABELS, SEEDS, ray=True, workers=2, jsonl=str(log), resume=True,
                   progress=False, **RUN)
    lines = log_lines(log)[1:]
    assert [e["seed"] for e in lines[:1]] == [0] and sorted(e["seed"] for e in lines[1:]) == [1, 2]
    assert all("worker" in e for e in lines[1:])  # seeds 1, 2 came back from Ray actors
    assert out["settings"]["ray"]["workers"] >= 1 and out["settings"]["resumed_episodes"] == 1
    assert comparable(out) == comparable(result)
    assert set(out) == set(result) and set(out["settings"]) == set(result["settings"])
    md = write_eval_report(out, tmp_path / "report").read_text()
    assert "| `asym:adaptive_k=false` |" in md


class CrashOnce:
    """Mixin for EpisodeWorker: the first worker process to reach seed 1's second engine call
    exits (like a killed node), leaving a marker so the retry goes through."""

    marker = None

    def run(self, seed):
        engine, calls = self.setup.engine, []
        chat = engine.chat

        def crashing_chat(*a, **kw):
            calls.append(1)
            if seed == 1 and len(calls) == 2 and not os.path.exists(self.marker):
                open(self.marker, "w").close()
                os._exit(1)
            return chat(*a, **kw)

        engine.chat = crashing_chat
        try:
            return super().run(seed)
        finally:
            engine.chat = chat


@pytest.mark.parametrize("max_restarts", [1, 0], ids=["ray-restarts-actor", "episode-requeued"])
def test_worker_dying_mid_episode_is_retried(ray_local, tiny_spec, local_result, tmp_path, max_restarts):
    """max_restarts=1: Ray restarts the actor and retries the call; 0: the actor stays dead and
    the driver hands the episode to the other actor. Either way the numbers equal the local run's."""
    import ray.cloudpickle

    from asymagent.evals.running.episodes import EpisodePlan, eval_result
    from asymagent.evals.running.ray_eval import EpisodeWorker, run_episodes_ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/
    worker = type("CrashingWorker", (CrashOnce, EpisodeWorker), {"marker": str(tmp_path / "crashed")})
    labels = ["full", "asym:adaptive_k=false"]
    plan = EpisodePlan("records", tuple(labels), **RUN)
    records = run_episodes_ray(tiny_spec, plan, [0, 1], workers=2, progress=False,
                               max_restarts=max_restarts, worker_cls=worker)
    assert os.path.exists(tmp_path / "crashed")  # it did die mid-episode
    # requeued: the surviving actor ran both episodes; restarted: seed 1 ran in a new process
    assert (records[0]["worker"] == records[1]["worker"]) == (max_restarts == 0)
    # the local run's episodes restricted to these modes (a mode's numbers do not depend on
    # which other modes share its episode: own cache sessions; fidelity needs only `full`)
    local = {e["seed"]: {**e, "modes": {k: e["modes"][k] for k in labels}}
             for e in log_lines(local_result[1])[1:]}
    assert comparable(eval_result(plan, [0, 1], records)) == comparable(eval_result(plan, [0, 1], local))
