"""The MegDet trainer: detectron2 training with partial SyncBN, accumulation and planned LR.

Heavy imports (torch, detectron2) live in the submodules; importing this package is cheap so
that `megdet --help` works without the training stack.
"""

import warnings

# detectron2 scripts a few helpers with torch.jit.script at import time; torch 2.14 warns that
# the API is deprecated. The warning is addressed to detectron2, not to our users, and it would
# otherwise open every `megdet train` run and error message (twice).
warnings.filterwarnings(
    "ignore", message=r"`torch\.jit\.script` is deprecated", category=FutureWarning
)
