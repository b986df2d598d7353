"""The bench scripts refuse what they cannot run with argparse's one line and status 2.

Each is run as a subprocess with options it refuses before reading any data,
so no data folder is needed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _bench(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / script), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _refused(result: subprocess.CompletedProcess) -> str:
    """The error line of a run argparse refused."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1]


def test_quality_needs_data_unless_it_only_renders():
    assert _refused(_bench("quality.py")).endswith("error: --data is required unless --render")
    assert "--render: expected at least one argument" in _refused(_bench("quality.py", "--render"))
