"""fusion_compare (evals/running/fusion_compare.py): positions of two fusion runs pair one to one and
the new view's recovered share is measured against the old view's gap."""

import math

from asymagent.evals.running import fusion_compare as fc


def _pos(suite, seed, step, kl_c, kl_f, top1=True):
    return {"suite": suite, "seed": seed, "step": step, "cls": "text", "kl_c": kl_c, "jsd": 0.0,
            "top1_c": top1, "kl_f": [kl_f], "top1_f": [top1]}


def test_shares_against_the_old_gap():
    old = [_pos("a", 1, 0, 1.0, 0.5), _pos("a", 1, 0, 1.0, 0.5), _pos("b", 2, 0, 2.0, 2.0)]
    new = [_pos("a", 1, 0, 0.2, 0.1), _pos("a", 1, 0, 0.2, 0.1), _pos("b", 2, 0, 1.0, 1.0)]
    res = fc.compare({"positions": old}, {"positions": new})
    a = res["suites"]["a"]
    assert a["positions"] == 2
    assert math.isclose(a["share_old_default"], 0.5) and math.isclose(a["share_new_default"], 0.9)
    ov = res["overall"]
    assert math.isclose(ov["share_old_default"], 1 - 3.0 / 4.0)
    assert math.isclose(ov["share_new_default"], 1 - 1.2 / 4.0)
    lo, hi = ov["share_new_ci"]
    assert lo <= ov["share_new_default"] <= hi


def test_unpaired_steps_are_left_out():
    old = [_pos("a", 1, 0, 1.0, 0.5), _pos("a", 1, 1, 1.0, 0.5)]
    new = [_pos("a", 1, 0, 0.5, 0.5)]  # step 1 not measured on the new view
    pairs = fc.pair_positions(old, new)
    assert len(pairs) == 1 and fc.figures(pairs)["positions"] == 1
    assert "suites_only" not in fc.compare({"positions": old}, {"positions": new})


def test_another_variant_of_the_new_run():
    old = [_pos("a", 1, 0, 1.0, 0.5), _pos("a", 2, 0, 1.0, 0.5)]
    new = [_pos("a", 1, 0, 0.5, 0.4), _pos("a", 2, 0, 0.5, 0.4)]
    for p in new:  # a second variant: fused KL 0.1, top-1 lost
        p["kl_f"].append(0.1)
        p["top1_f"].append(False)
    first, second = (fc.compare({"positions": old}, {"positions": new}, v)["overall"] for v in (0, 1))
    assert math.isclose(first["share_new_default"], 0.6) and first["top1_fused_new"] == 1.0
    assert math.isclose(second["share_new_default"], 0.9) and second["top1_fused_new"] == 0.0
    assert math.isclose(second["share_old_default"], first["share_old_default"])
