"""evals/probes/view_walk.py: views of several configs along the suites' oracle episodes, tokenizer only."""

from __future__ import annotations

import json


def test_walk_measures_shares_prefill_and_changed_steps(smollm_tokenizer, tmp_path):
    from asymagent.evals.probes.view_walk import measure

    rows = measure(["records"], [0], ["default", "default", "none", "id_keep_blocks"], smollm_tokenizer)
    base, same, none, blocks = rows
    assert [r.config for r in rows] == ["default", "default", "none", "id_keep_blocks"]
    assert base.steps == same.steps == none.steps == blocks.steps > 0
    assert same.changed == 0 and same.verifier_prefill == base.verifier_prefill  # the walk is deterministic
    assert none.share == 1.0 and none.prefill_share == 1.0 and none.changed > 0  # records' outputs are cut
    assert 0 < base.share < 1 and 0 < base.prefill_share < 1
    assert base.full_prefill == blocks.full_prefill  # the full view does not depend on the config


def test_main_writes_the_rows_and_its_command(smollm_tokenizer, tmp_path, monkeypatch):
    from asymagent.evals.probes import view_walk

    monkeypatch.setattr("asymagent.evals.probes.harness.load_tokenizer", lambda source: smollm_tokenizer)
    out = tmp_path / "walk.json"
    assert view_walk.main(["--suites", "records", "--seeds", "0", "--configs", "default,id_keep_blocks",
                           "--tokenizer", "tok", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["rows"]) == {"records/default", "records/id_keep_blocks"}
    assert doc["command"].startswith("python -m asymagent.evals.probes.view_walk")
