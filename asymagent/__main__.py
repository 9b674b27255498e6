"""`python -m asymagent`: the `asymagent` command (asymagent.integrations.cli.main).

An entry point, imported by nothing: the one core-layer file allowed to name a face
(tests/test_layers.py lists it as the exemption).
"""

from asymagent.integrations.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
