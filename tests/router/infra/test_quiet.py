"""Quieting third-party output imports no library (router/infra/quiet.py)."""

from __future__ import annotations

import subprocess
import sys


def test_quieting_third_party_output_imports_no_library():
    """The wrapper around every command turns bars off in libraries already imported and sets the variables the
    others read on import: importing transformers and datasets for it cost every command (`specroute rules`
    included) about 1.7 s."""
    code = (
        "import sys\nfrom specroute import cli\nassert cli.main(['rules']) == 0\n"
        "print(sorted(m for m in ('transformers', 'datasets', 'huggingface_hub') if m in sys.modules))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[]"
