"""Version shims between ignite, torch and torch_xla, each applied only where needed.

``apply()`` runs on ``import distkit``. Without torch_xla it does nothing. With it, each
shim first checks that the problem it repairs is present in the installed versions (by
looking at the code it replaces, not at version numbers), so it switches itself off once
ignite or torch-xla fix the problem upstream. Known today (pytorch-ignite 0.5.5,
torch 2.9-2.15, torch-xla 2.9.0):

``fork_safe_cuda_check``
    ``torch.cuda.is_available()`` initialises the CUDA driver, after which a *forked*
    process cannot use CUDA ("poison fork"); ``idist.Parallel`` forks under IPython.
    The shim sets ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (unless already set), so the check
    asks NVML instead. Applied with or without torch_xla.

``xla_rank_and_world_size``
    ignite's ``xla-tpu`` backend asks ``torch_xla.core.xla_model`` for
    ``xrt_world_size()`` and ``get_ordinal()``, which torch-xla 2.7 removed (today:
    ``torch_xla.runtime.world_size()`` / ``global_ordinal()``). As ignite probes every
    backend, *all* of ``idist`` then fails with ``AttributeError`` as soon as torch_xla
    is installed, even for gloo.
``xla_optimizer_init``
    ``idist.auto_optim`` builds, on XLA, a new class from the *dict* of ignite's
    ``_XLADistributedOptimizer``; that class's ``__init__`` uses zero-argument
    ``super()``, bound to the original class, so the call fails with ``TypeError:
    super(type, obj): obj must be an instance or subtype of type``.
``xla_pjrt_spawn``
    Under PJRT (the only runtime since torch-xla 2.1), ``xmp.spawn`` accepts
    ``nprocs`` 1 (one device) or ``None`` (every device of the host), nothing else,
    and no ``master_addr`` / ``master_port``. ignite passes ``nproc_per_node`` and
    those straight through, so ``idist.Parallel(backend="xla-tpu", nproc_per_node=8)``
    fails. The shim maps ``nproc_per_node`` = the host's device count to ``None`` and
    refuses other counts in one line.
``xla_lazy_context``
    The first ``idist.get_rank()`` / ``idist.device()`` (ignite's own launcher logs call
    one) makes ignite's XLA backend start the XLA runtime in the *launching* process, so
    ``xmp.spawn`` then refuses to start replicas: "Runtime is already initialized. Do not
    use the XLA device before calling xmp.spawn." The shim keeps ignite from starting it.
"""
from __future__ import annotations

import importlib.util
import os

from distkit.errors import DistkitError

SHIM_MARK = "__distkit_shim__"


APPLIED: list[str] = []
"""The shims ``import distkit`` applied in this process."""


def apply() -> list[str]:
    """Apply every shim this environment needs; return the names of those applied
    (also added to :data:`APPLIED`). ``DISTKIT_NO_COMPAT=1`` turns them all off, to see
    the original failures."""
    if os.environ.get("DISTKIT_NO_COMPAT") == "1":
        return []
    applied = []
    if fork_safe_cuda_check(os.environ):
        applied.append("fork_safe_cuda_check")
    if importlib.util.find_spec("torch_xla") is not None:
        applied += _apply_xla()
    APPLIED.extend(applied)
    return applied


def fork_safe_cuda_check(environ) -> bool:
    """Make ``torch.cuda.is_available()`` ask NVML instead of initialising the CUDA driver
    (``PYTORCH_NVML_BASED_CUDA_CHECK=1``, read by torch at every call), unless the user
    chose otherwise. By default that call runs ``cuInit``, after which forked processes
    cannot use CUDA: and ``idist.Parallel`` forks in notebooks, after ignite, distkit
    and the learner have all asked whether there is a GPU."""
    if "PYTORCH_NVML_BASED_CUDA_CHECK" in environ:
        return False
    environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    return True


def _apply_xla() -> list[str]:
    from ignite.distributed import auto
    from ignite.distributed.comp_models import xla as ignite_xla

    if not ignite_xla.has_xla_support:  # torch_xla present but not importable
        return []
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.xla_multiprocessing as xmp
    import torch_xla.runtime as xr

    applied = []
    if patch_rank_and_world_size(ignite_xla._XlaDistModel, xm, xr):
        applied.append("xla_rank_and_world_size")
    if patch_optimizer_init(auto._XLADistributedOptimizer):
        applied.append("xla_optimizer_init")
    if patch_pjrt_spawn(ignite_xla._XlaDistModel, xmp, xla_local_device_count):
        applied.append("xla_pjrt_spawn")
    if patch_lazy_context(ignite_xla._XlaDistModel, torch_xla._XLAC):
        applied.append("xla_lazy_context")
    return applied


def _uses(function, name: str) -> bool:
    """True if ``function``'s own code refers to the global or attribute ``name``."""
    code = getattr(function, "__code__", None)
    return code is not None and name in code.co_names


def _mark(function):
    setattr(function, SHIM_MARK, True)
    return function


# --------------------------------------------------------------------- rank / world size

# ignite method -> (name it calls on xla_model, torch_xla.runtime function that replaced it)
RUNTIME_REPLACEMENTS = {
    "get_world_size": ("xrt_world_size", "world_size"),
    "get_rank": ("get_ordinal", "global_ordinal"),
    "get_local_rank": ("get_local_ordinal", "local_ordinal"),
}


def patch_rank_and_world_size(model_cls, xla_model, runtime) -> bool:
    """Point the ignite XLA model's rank / world-size methods at ``torch_xla.runtime``
    where they call a function ``xla_model`` no longer has. Returns True if it patched."""
    patched = False
    for method_name, (old, new) in RUNTIME_REPLACEMENTS.items():
        method = getattr(model_cls, method_name)
        if not _uses(method, old) or hasattr(xla_model, old):
            continue  # ignite no longer calls it, or torch_xla still has it
        replacement = getattr(runtime, new)

        def method_via_runtime(self, _replacement=replacement):
            return _replacement()

        method_via_runtime.__name__ = method_name
        method_via_runtime.__doc__ = f"distkit.compat.shims: torch_xla.runtime.{new}() (xla_model.{old} was removed)"
        setattr(model_cls, method_name, _mark(method_via_runtime))
        patched = True
    return patched


# --------------------------------------------------------------------- auto_optim on XLA

def patch_optimizer_init(wrapper_cls) -> bool:
    """Replace the zero-argument ``super()`` in ignite's XLA optimizer wrapper by an
    explicit ``super(type(self), self)``: the class ``auto_optim`` builds from the
    wrapper's dict derives from the user's optimizer class (e.g. SGD), whose
    ``__init__`` then receives the param groups, as ignite intends."""
    init = wrapper_cls.__init__
    if "__class__" not in getattr(getattr(init, "__code__", None), "co_freevars", ()):
        return False  # no zero-argument super() (fixed upstream, or already patched)

    def __init__(self, optimizer):
        super(type(self), self).__init__(optimizer.param_groups)
        self.wrapped_optimizer = optimizer

    __init__.__doc__ = "distkit.compat.shims: explicit super(); see distkit.compat.shims's docstring"
    wrapper_cls.__init__ = _mark(__init__)
    return True


# --------------------------------------------------------------------- spawning under PJRT

def xla_local_device_count() -> int:
    """XLA devices on this host, read without starting the XLA runtime (a TPU can be
    opened by one process only, so the launching process must not touch it).

    TPU: chips found on the PCI bus x cores per chip (v2/v3: 2; v4 and later: 1). CPU:
    ``CPU_NUM_DEVICES`` (default 1)."""
    import torch_xla.runtime as xr

    device_type = (xr.device_type() or os.environ.get("PJRT_DEVICE", "CPU")).upper()
    if device_type == "TPU":
        from torch_xla._internal import tpu

        return max(1, tpu.num_available_devices())
    if device_type == "CPU":
        return int(os.environ.get("CPU_NUM_DEVICES", "1"))
    return 1


def pjrt_nprocs(nproc_per_node: int, local_devices: int):
    """What ``xmp.spawn(nprocs=...)`` accepts under PJRT for ``nproc_per_node``: 1, or
    ``None`` meaning every local device."""
    if nproc_per_node == 1:
        return 1
    if nproc_per_node == local_devices:
        return None
    raise DistkitError(
        f"--nproc-per-node {nproc_per_node} with xla-tpu: torch-xla (PJRT) runs 1 replica or one "
        f"per device of this host, which has {local_devices}: use --nproc-per-node 1 or "
        f"{local_devices} (or leave it out)")


def patch_pjrt_spawn(model_cls, xmp, local_device_count) -> bool:
    """Make ignite's XLA spawn speak PJRT: ``nprocs`` 1 or None, no address/port."""
    spawn = model_cls.__dict__["spawn"]
    function = getattr(spawn, "__func__", spawn)
    # Needed while ignite hands its spawn to xmp.spawn and xmp.spawn is PJRT's.
    if getattr(function, SHIM_MARK, False) or not _uses(function, "xmp") \
            or not _uses(xmp.spawn, "pjrt"):
        return False
    original_worker = model_cls._dist_worker_task_fn
    backend_default = getattr(model_cls, "available_backends", ("xla-tpu",))[0]

    def pjrt_spawn(fn, args, kwargs_dict=None, nproc_per_node=1, nnodes=1, node_rank=0,
                   backend=backend_default, **kwargs):
        nprocs = pjrt_nprocs(nproc_per_node, local_device_count())
        for name in ("master_addr", "master_port", "init_method"):
            kwargs.pop(name, None)  # PJRT finds its peers itself
        kwargs.setdefault("start_method", "fork")
        xmp.spawn(original_worker, args=(backend, fn, args, kwargs_dict), nprocs=nprocs, **kwargs)

    model_cls.spawn = staticmethod(_mark(pjrt_spawn))
    return True


# --------------------------------------------------------------------- no runtime in the parent

def patch_lazy_context(model_cls, xlac) -> bool:
    """ignite asks every backend "are we inside you?" at the first ``idist.get_rank()``,
    ``idist.device()`` or logger set-up, and the XLA backend answers by *starting* the XLA
    runtime (``xr.world_size()``). In the launching process that grabs the TPU, after
    which ``xmp.spawn`` refuses to start the replicas ("Runtime is already initialized").
    The shim makes it answer "no" until the runtime has been started by someone else
    (a replica, ``idist.initialize("xla-tpu")`` or the user's own XLA tensors)."""
    create = model_cls.__dict__["create_from_context"]
    function = getattr(create, "__func__", create)
    if getattr(function, SHIM_MARK, False) or _uses(function, "_xla_runtime_is_initialized") \
            or not hasattr(xlac, "_xla_runtime_is_initialized"):
        return False

    def create_from_context():
        if not xlac._xla_runtime_is_initialized():
            return None  # not inside XLA yet: leave the runtime (and the TPU) alone
        return function()

    model_cls.create_from_context = staticmethod(_mark(create_from_context))
    return True


# --------------------------------------------------------------------- is there a TPU?

# PCI ids of TPU chips (vendor Google), as torch-xla 2.9 lists them in torch_xla/_internal/tpu.py.
GOOGLE_PCI_VENDOR = "0x1ae0"
TPU_PCI_DEVICES = {"0x0027": "v2/v3", "0x005e": "v4", "0x0063": "v5e", "0x006f": "v6e", "0x0076": "7x"}


def tpu_chips(sys_root: str = "/sys") -> dict:
    """TPU chips attached to this machine, by generation, read from the PCI bus: works
    before torch_xla is installed (to decide whether to install it) and never starts the
    XLA runtime. ``{}`` on a machine without TPU."""
    import glob

    found: dict = {}
    for vendor in glob.glob(os.path.join(sys_root, "bus", "pci", "devices", "*", "vendor")):
        try:
            with open(vendor) as f:
                if f.read().strip() != GOOGLE_PCI_VENDOR:
                    continue
            with open(os.path.join(os.path.dirname(vendor), "device")) as f:
                generation = TPU_PCI_DEVICES.get(f.read().strip())
        except OSError:
            continue
        if generation:
            found[generation] = found.get(generation, 0) + 1
    return found


def broadcast_text(text: str, src: int = 0) -> str:
    """``text`` from rank ``src`` to every rank (a collective). ignite's
    ``idist.broadcast`` of a ``str`` sizes its buffer in characters and fills it with UTF-8
    bytes, so a non-ASCII string (a folder named ``données``) arrives cut, or the
    broadcast fails. Sent as JSON's ASCII escapes, every character is one byte; a name
    that is not valid UTF-8 (``surrogateescape``) comes back as it was."""
    import json

    import ignite.distributed as idist

    return json.loads(idist.broadcast(json.dumps(text), src=src, safe_mode=True))
