"""For every test folder: the repository root on ``sys.path``, once.

``bench/`` is a top-level folder, not an installed package; tests import it one way,
``from bench import <module>``, whatever runs them (``python -m pytest`` puts the working
directory on the path, a bare ``pytest`` does not)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))
