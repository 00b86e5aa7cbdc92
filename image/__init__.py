"""What runs inside a pod: the PyTorchJob-env launcher (`megdet launch`) and `megdet doctor`."""
