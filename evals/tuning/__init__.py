"""`asymagent tune`: the one-knob-at-a-time search on held-out traces and its frontier report."""
