"""``python -m celery_fair_green``: what it says when the green library is missing."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("green", ["gevent", "eventlet"])
def test_a_missing_green_library_is_one_line_naming_the_extra_not_a_traceback(green):
    # As in a virtualenv without it (None in sys.modules: its import fails, as if absent),
    code = (
        f"import sys; sys.modules[{green!r}] = None; "
        "from celery_fair_green.__main__ import main; "
        f"sys.exit(main([{green!r}, '-A', 'app', 'worker', '-P', 'fair']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"celery_fair_green: the {green} pool needs {green}, which is not installed: "
        f"pip install 'celery-fair[green]' (or pip install {green})"
    )
    assert "Traceback" not in done.stderr
