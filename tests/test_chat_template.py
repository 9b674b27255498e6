"""Models without a chat template: text completions and `generate` work, chat is refused in one
line naming the way out, and `serve --chat-template FILE|STRING` (vLLM's flag) supplies one."""

from __future__ import annotations

import argparse
import copy

import httpx
import pytest

from asymagent.context.rendering import NoChatTemplate, chat_template_text
from families import make_family

USER = [{"role": "user", "content": "Hello there"}]


def test_chat_template_text_file_or_string(tmp_path):
    literal = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert chat_template_text(literal) == literal
    path = tmp_path / "t.jinja"
    path.write_text(literal)
    assert chat_template_text(str(path)) == literal
    with pytest.raises(ValueError, match="no such file"):
        chat_template_text(str(tmp_path / "missing.jinja"))
    (tmp_path / "empty.jinja").write_text("  \n")
    with pytest.raises(ValueError, match="empty"):
        chat_template_text(str(tmp_path / "empty.jinja"))


def test_a_missing_template_file_is_refused_before_any_model_loads(run_cli, no_model_loads, tmp_path):
    code, err = run_cli(["serve", "--chat-template", str(tmp_path / "nope.jinja"), "--mode", "full"])
    assert code == 2 and "--chat-template" in err and "Traceback" not in err


@pytest.fixture(scope="module")
def bare_model(tmp_path_factory, smollm_tokenizer):
    """A saved model whose tokenizer has no chat template (a base model), and SmolLM2's template."""
    path = tmp_path_factory.mktemp("base")
    make_family("gemma3_text").save_pretrained(path)
    tok = copy.deepcopy(smollm_tokenizer)
    template = tok.chat_template
    tok.chat_template = None
    tok.save_pretrained(path)
    return path, template


def _engine(path, *extra):
    from asymagent.integrations.serve import add_arguments, load_engine

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return load_engine(parser.parse_args([str(path), "--drafter", "layers:1", *extra]))


def test_without_a_template_completions_and_generate_work_chat_is_refused(bare_model):
    from asymagent.integrations.server import create_app
    from test_server import serving

    engine = _engine(bare_model[0])
    assert engine.tokenizer.chat_template is None
    ids = engine.tokenizer.encode("Hello there")
    assert len(engine.generate(ids, mode="spec", max_new_tokens=6).token_ids) == 6
    with pytest.raises(NoChatTemplate, match="--chat-template"):
        engine.chat(USER, max_new_tokens=4)
    with serving(create_app(engine, default_max_tokens=8)) as url:
        r = httpx.post(url + "/v1/completions", json={"model": "asymagent", "prompt": "Hello there",
                                                      "max_tokens": 8, "mode": "spec"}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8, r.text
        r = httpx.post(url + "/v1/chat/completions", json={"model": "asymagent", "messages": USER},
                       timeout=60)
        error = r.json()["error"]
        assert r.status_code == 400 and "--chat-template" in error["message"]
        assert "\n" not in error["message"] and "Traceback" not in error["message"]


def test_chat_template_flag_serves_chat(bare_model, tmp_path):
    path, template = bare_model
    file = tmp_path / "chat.jinja"
    file.write_text(template)
    for given in (str(file), template):  # a file, or the template itself
        engine = _engine(path, "--chat-template", given)
        r = engine.chat(USER, mode="spec", max_new_tokens=6)
        assert len(r.token_ids) == 6 and r.stats.full_context_tokens > 5
    with pytest.raises(ValueError, match="--chat-template"):  # renders, but not append-stably
        _engine(path, "--chat-template", "{{ messages | length }}")
