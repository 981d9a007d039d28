"""dpeer: coordinator-free, fault-tolerant data-parallel PyTorch training."""

__version__ = "0.1.0"
