"""The MegDet trainer: detectron2 training with partial SyncBN, accumulation and planned LR.

Heavy imports (torch, detectron2) live in the submodules; importing this package is cheap so
that `megdet --help` works without the training stack.
"""
