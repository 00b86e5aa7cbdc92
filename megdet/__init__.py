"""MegDet on Kubernetes: large-batch detection training from a laptop to GPU clusters."""

__version__ = "0.1.0"
