"""The start banner (asymagent/model_banner.py): it names the models, dtype, CPU kind, the probes' floors and threads."""

from __future__ import annotations

import torch
from conftest import make_tiny_llama

from asymagent.model_banner import model_banner, source_names


def _engine(dtype):
    from asymagent.engine import Engine

    verifier = make_tiny_llama(seed=1).to(dtype)
    drafter = make_tiny_llama(layers=1, seed=2).to(dtype)
    return Engine(verifier=verifier, drafter=drafter, tokenizer=None)


def test_bf16_banner_names_models_dtype_cpu_floors_and_threads():
    from asymagent.kv.attention import attention_floor, grouped_rows_exact
    from asymagent.modeling.cpu_family import cpu_choice

    engine = _engine(torch.bfloat16)
    engine.model_names = {"source": "pair test", "verifier": "big.gguf", "drafter": "small.gguf"}
    banner = model_banner(engine)
    assert banner.attention_floor == attention_floor(torch.bfloat16)
    assert banner.grouped_rows_exact == grouped_rows_exact()
    assert set(banner.linear_floors) == {f"{o}x{i}" for o, i in {
        tuple(m.weight.shape) for m in engine.verifier.modules() if isinstance(m, torch.nn.Linear)}}
    assert banner.threads == torch.get_num_threads()
    text = banner.text()
    family = cpu_choice()["family"]
    for needle in ("pair test", "big.gguf", "small.gguf", "bfloat16 on cpu", family,
                   f"attention floor {banner.attention_floor}", "linear floors",
                   "grouped_rows_exact: " + ("yes" if banner.grouped_rows_exact else "no"),
                   f"threads      : {torch.get_num_threads()}"):
        assert needle in text, (needle, text)
    assert len(text.splitlines()) == 8  # one fact a line
    assert banner.to_dict()["cpu_family"] == family


def test_float32_banner_says_no_floors_and_names_models_from_their_configs():
    engine = _engine(torch.float32)
    text = model_banner(engine).text()
    assert "float32 on cpu" in text and "row floors" in text and "none" in text
    assert "grouped_rows_exact: not probed" in text
    assert "M parameters" in text  # no names given: the configs' and the sizes
    assert "your models" in text


def test_source_names_of_a_pair_and_of_plain_sources():
    names = source_names("pair:qwen2.5-coder", None)
    assert names["source"].startswith("pair qwen2.5-coder")
    assert names["verifier"] == "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    assert names["drafter"] == "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    assert source_names("my/model", None) == {"source": "your models", "verifier": "my/model",
                                               "drafter": "none"}


def test_eval_and_bench_announce_the_block(capsys):
    from asymagent.evals.running.engine_setup import EngineSetup

    setup = EngineSetup(_engine(torch.float32), "pair:qwen2.5-coder: two GGUFs", "d.gguf", False)
    setup.announce("eval")
    err = capsys.readouterr().err
    assert err.startswith("asymagent eval: models\n")
    assert "pair qwen2.5-coder" in err and "d.gguf" in err and "threads" in err
