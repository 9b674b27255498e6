"""Importing asymagent from the repository root: our kernels/ folder must not shadow pip's `kernels`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_python_c_from_repo_root_imports_transformers_integrations():
    # `python -c` / `python -m` from the root put the root first on sys.path; transformers then
    # imports `kernels` (a dependency of recent transformers) and found our source folder instead.
    pytest.importorskip("transformers")
    code = (
        "import asymagent, sys\n"
        "import transformers.integrations.hub_kernels\n"
        "import asymagent.kernels as ours\n"
        "assert ours.__file__.endswith('__init__.py'), ours.__file__\n"
        "mod = sys.modules.get('kernels')\n"
        "assert mod is None or 'site-packages' in (mod.__file__ or ''), mod\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok")
