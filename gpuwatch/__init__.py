"""gpuwatch: a terminal dashboard and launcher for TensorFlow multi-GPU training."""

__version__ = "0.1.0"
