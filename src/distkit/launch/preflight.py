"""The checks before a run may start, under the name notebooks and courses import them
by (``distkit.preflight``): they live in :mod:`distkit.launch.checks`, the one place that
decides whether a run may start::

    >>> from distkit.config import Config
    >>> from distkit.launch.preflight import preflight
    >>> cfg, launch = preflight(Config(backend="gloo"), spawning=True)
    >>> cfg.backend, cfg.nproc_per_node, launch.world_size, launch.master_port is not None
    ('gloo', 2, 2, True)
"""
from distkit.launch.checks import (  # noqa: F401
    CPU_DEFAULT_NPROC, OVERSUBSCRIBED, SYNTHETIC_BYTES_PER_SAMPLE, Launch, check_launch,
    check_picklable, check_sizes, check_synthetic_fits_in_memory, dataset_sizes, default_nproc,
    oversubscription_warning, preflight, process_memory, resolve_backend, restarted_by_torchrun)
