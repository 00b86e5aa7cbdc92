"""The MegDet trainer: detectron2 training with partial SyncBN, accumulation and planned LR.

Heavy imports (torch, detectron2) live in the submodules; importing this package is cheap so
that `megdet --help` works without the training stack.
"""

import logging
import warnings

# Deprecation notices that torch 2.14 addresses to detectron2's code, not to our users; they
# would otherwise open every `megdet train` run and error message. Each filter matches one
# message exactly, so anything else still shows.
# - detectron2 scripts a few helpers with torch.jit.script at import time;
warnings.filterwarnings(
    "ignore", message=r"`torch\.jit\.script` is deprecated", category=FutureWarning
)
# - its anchor generator calls torch.meshgrid without `indexing`;
warnings.filterwarnings(
    "ignore", message=r"torch\.meshgrid: in an upcoming release", category=UserWarning
)
# - its FX-tracing guard calls torch.fx.is_fx_tracing (logged, once per process).
logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
