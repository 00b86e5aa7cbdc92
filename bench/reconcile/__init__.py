"""The controller benchmark's parts; ``python -m bench.controller_reconcile`` is its command.

``options``: what one invocation measures (one dataclass, its flags generated from it);
``memory``: what the controller process reads of its own memory and time; ``controller``: the
controller process; ``driver``: the runs applied to kmock or a real API server; ``report``: the
results assembled, compared and printed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def kmock_helpers() -> Any:
    """tests/controller/kmock_helpers.py: the emulator extensions live with the controller
    tests; reuse them rather than copy."""
    folder = str(ROOT / "tests" / "controller")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import kmock_helpers

    return kmock_helpers
