"""The typed request (asymagent/request.py) and the request plan (asymagent/decoding/plan.py)."""

from __future__ import annotations

import dataclasses

import pytest

from asymagent.decoding.plan import Acceptance, plan_request
from asymagent.request import GenerationRequest, RequestError, SamplingParams
from asymagent.spec_config import MODE_TABLE, SpecConfig


@pytest.mark.parametrize("field, value, message", [
    ("temperature", -0.1, "temperature must be >= 0"),
    ("temperature", "hot", "temperature must be a number"),
    ("top_p", 0.0, "top_p must be in (0, 1]"),
    ("top_k", -1, "top_k must be an integer >= 0"),
    ("top_k", 2.5, "top_k must be an integer >= 0"),
    ("min_p", 1.5, "min_p must be in [0, 1]"),
    ("frequency_penalty", 3.0, "frequency_penalty must be in [-2, 2]"),
    ("presence_penalty", -2.5, "presence_penalty must be in [-2, 2]"),
    ("logit_bias", {3: 101.0}, "logit_bias for token 3 must be in [-100, 100]"),
    ("logit_bias", {"x": 1.0}, "logit_bias token 'x' is not a token id"),
    ("seed", "abc", "seed must be a number"),
])
def test_each_bad_sampling_field_is_named(field, value, message):
    with pytest.raises(RequestError, match=message.replace("(", r"\(").replace("[", r"\[")) as err:
        SamplingParams(**{field: value})
    assert err.value.field == field and isinstance(err.value, ValueError)


@pytest.mark.parametrize("fields, name", [
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=True), "max_new_tokens"),
    (dict(stop=["ok", ""]), "stop"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(logprobs=21), "logprobs"),
    (dict(logprobs=True), "logprobs"),
    (dict(parallel_tool_calls="yes"), "parallel_tool_calls"),
    (dict(cache_key=3), "cache_key"),
])
def test_each_bad_request_field_is_named(fields, name):
    with pytest.raises(RequestError) as err:
        GenerationRequest(**fields)
    assert err.value.field == name and name.split("_")[0] in str(err.value)


def test_unknown_mode_keeps_its_message():
    with pytest.raises(ValueError, match="unknown mode 'turbo'"):
        GenerationRequest(mode="turbo")


def test_values_are_normalised_once():
    s = SamplingParams(temperature=1, top_p=1, seed=7.0, logit_bias={"13": -2})
    assert (s.temperature, s.top_p, s.seed, s.logit_bias) == (1.0, 1.0, 7, {13: -2.0})
    assert isinstance(s.temperature, float) and s.sampled
    r = GenerationRequest(stop="END")
    assert r.stop == ("END",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.mode = "full"


def test_build_and_replace_route_sampling_knobs_by_name():
    r = GenerationRequest.build(mode="spec", max_new_tokens=9, temperature=0.5, seed=1, top_k=4)
    assert r.sampling == SamplingParams(temperature=0.5, seed=1, top_k=4)
    r2 = r.replace(seed=2, cache_key="c")
    assert (r2.sampling.seed, r2.sampling.temperature, r2.cache_key, r2.mode) == (2, 0.5, "c", "spec")
    assert r.sampling.seed == 1  # the original is unchanged
    with pytest.raises(RequestError, match="temperature"):
        r.replace(temperature=-1)  # a changed copy is checked again


def test_engine_checks_name_their_field():
    r = GenerationRequest.build(mode="asym", logit_bias={500: 1.0}, stop=["x"])
    with pytest.raises(RequestError, match="needs a drafter") as err:
        r.check_engine(vocab_size=1000, has_drafter=False, has_tokenizer=True)
    assert err.value.field == "mode"
    with pytest.raises(RequestError, match=r"not a token id in \[0, 100\)") as err:
        r.check_engine(vocab_size=100, has_drafter=True, has_tokenizer=True)
    assert err.value.field == "logit_bias"
    with pytest.raises(RequestError, match="need a tokenizer"):
        r.check_engine(vocab_size=1000, has_drafter=True, has_tokenizer=False)
    r.check_engine(vocab_size=1000, has_drafter=True, has_tokenizer=True)


def test_acceptance_is_resolved_once_into_what_the_gate_runs():
    assert Acceptance.of("greedy", 0.0) == Acceptance("greedy", "greedy")
    assert Acceptance.of("coupled", 0.7) == Acceptance("coupled", "greedy", perturb=True)
    assert Acceptance.of("greedy", 0.7).perturb  # greedy at T > 0 is the coupled rule
    assert Acceptance.of("exact", 0.7) == Acceptance("exact", "exact", gate_noise=True)
    assert Acceptance.of("cda", 0.7) == Acceptance("cda", "cda")


def test_plan_says_what_runs_and_why():
    asym, full = MODE_TABLE["asym"], MODE_TABLE["full"]
    p = plan_request(asym, SpecConfig(), 0.0, two_views=True)
    assert p.drafters == ("suffix", "model") and p.suffix_store and p.copy_delta
    assert not p.base_pass and p.adaptive_k and not p.escalation
    assert p.verifier_role == "verifier_compressed" and "nothing reads it" in p.reasons["base_pass"]
    assert set(p.reasons) >= {"verifier", "drafters", "base_pass", "copy_delta", "acceptance",
                              "adaptive_k", "escalation"}
    assert "base_pass: False" in p.describe()
    assert not p.drafter_rows and "drafter_rows: False" in p.describe()  # nothing reads them
    cda = plan_request(asym, SpecConfig(acceptance="cda", strict_prefix=3), 0.7, two_views=True)
    assert cda.base_pass and cda.drafter_rows and not cda.adaptive_k and not cda.suffix_store
    assert plan_request(asym, SpecConfig(acceptance="cda"), 0.0, two_views=False).drafter_rows
    assert plan_request(asym, SpecConfig(beta=1.0), 0.0, two_views=True).drafter_rows
    assert cda.acceptance_at(0).perturb and cda.acceptance_at(2).gate == "greedy"
    assert cda.acceptance_at(3).gate == "cda"
    one = plan_request(asym, SpecConfig(beta=1.0), 0.0, two_views=False)
    assert not one.base_pass and not one.copy_delta  # one view: the deltas are 0
    alone = plan_request(full, SpecConfig(), 0.0, two_views=True)
    assert alone.drafters == () and not alone.speculative and alone.verifier_role == "verifier_full"
    lookup = plan_request(MODE_TABLE["spec"], SpecConfig(suffix=False), 0.0, two_views=False)
    assert lookup.drafters == ("lookup", "model") and lookup.acceptance.gate == "greedy"
