"""distkit: a teaching kit for distributed data-parallel training with PyTorch-Ignite.

The same ``distkit.training.training`` function runs on 1 CPU process, N GPUs, a TPU and
many nodes; ``distkit.launch.run`` starts it the right way for where it runs.
"""
from distkit import compat as _compat

__version__ = "0.1.0"

_compat.apply()
