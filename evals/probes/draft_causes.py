"""Why a verifier forward drafted nothing: counters per decode step, by mode (issue 56).

`install()` wraps the decode loop's step (asymagent/decoding/loop.py `decode_step`) and
`FeatureDrafter.propose` of the running process and counts, per mode, what each verifier
forward of the decode loop did: the draft source of a round (`feature_after_jump_forward`: the
head drafted after tokens no forward had read), or why a plain step ran:
- `plain_probe`: adaptive K's plain probe measuring t_plain (DraftChoice.want_probe);
- `plain_last_token`: one token left to emit or one position left in the context (K = 0);
- `plain_head_off`: no copy, and the head switched off (its rounds are judged in the drafter
  model's AdaptiveK);
- `plain_features_behind`: more than MAX_PENDING view tokens without features;
- `plain_constraint_blocked`: the constraint allows no prefix of the head's drafts (its first
  draft is not allowed); `..._after_jump_forward` when that followed a jump-forward;
- `plain_not_asked`: a mode with no drafters (full).
The counts ({mode: {what: forwards}}) go to stdout and to the file `DRAFT_CAUSES_OUT` names.

Measured on the pair (docs/drafter.md, "Why forwards draft nothing"), in the shell:
    python -c "import sys; from asymagent.evals.probes import draft_causes; draft_causes.install(); \
      from asymagent.integrations.cli import main; sys.exit(main(sys.argv[1:]))" bench --pair ...
Speed only changes by the wrapper's few checks; the tokens are the engine's own.
"""

from __future__ import annotations

import atexit
import collections
import json
import os

from asymagent.decoding import feature_drafter, loop

COUNTS: dict = collections.defaultdict(collections.Counter)  # mode -> what the forward did -> forwards
_now: dict = {}  # what the current step's feature proposal saw


def _propose(original):
    def propose(self, k):
        cache = self.verifier.cache
        pending = None
        if cache.capture is not None:
            capture, _ = self.state()
            pending = len(self.verifier.view.ids()) - 1 - capture.valid(len(cache.tokens))
        out = original(self, k)
        if k >= 1 and not out:
            if pending is None:
                _now["why"] = "no_capture"
            elif pending > feature_drafter.MAX_PENDING or pending < 0:
                _now["why"] = "features_behind"
            else:
                _now["why"] = "constraint_blocked" + ("_after_jump_forward" if pending else "")
        elif out and pending:
            _now["after"] = pending
        return out
    return propose


def _wrap_step(original):
    def step(decoder, plan, choice, speculating, where):
        _now.clear()
        probe = plan.adaptive_k and speculating and choice.want_probe()  # read-only
        head_on = choice.model.enabled
        out = original(decoder, plan, choice, speculating, where)
        if out.drafted:
            key = out.source + ("_after_jump_forward" if out.source == "feature" and "after" in _now else "")
        elif not speculating:
            key = "plain_not_asked"
        elif probe:
            key = "plain_probe"
        elif min(where[1], where[2]) <= 1:
            key = "plain_last_token"
        elif not head_on:
            key = "plain_head_off"
        else:
            key = "plain_" + _now.get("why", "no_proposal")
        COUNTS[plan.mode.name][key] += 1
        return out
    return step


def install() -> None:
    """Wrap the loop's step and the head's proposal in this process; print the counts at exit."""
    feature_drafter.FeatureDrafter.propose = _propose(feature_drafter.FeatureDrafter.propose)
    loop.decode_step = _wrap_step(loop.decode_step)
    atexit.register(_dump)


def _dump() -> None:
    counts = {mode: dict(sorted(c.items())) for mode, c in sorted(COUNTS.items())}
    print("draft causes:", json.dumps(counts))
    path = os.environ.get("DRAFT_CAUSES_OUT")
    if path:
        with open(path, "w") as f:
            json.dump(counts, f, indent=1)
