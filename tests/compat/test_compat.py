"""distkit.compat.shims in the main environment, where torch_xla is absent (by design: it pins
torch). Here we check the guard (nothing XLA is touched) and the patch logic.

torch_xla cannot be imported here, so the XLA patch functions are exercised on stand-in
objects shaped like the real ones: classes whose methods call the same names ignite
0.5.5's do, and modules offering what torch-xla 2.9 offers. The real objects are
patched, and the real failures shown and repaired, in tests/compat/test_xla.py (torch-xla env).
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import types

import pytest
import torch

from distkit.compat import shims as compat
from distkit.errors import DistkitError


def python(code, **env):
    import os

    full = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_NVML_BASED_CUDA_CHECK", "DISTKIT_NO_COMPAT")}
    full.update(env)
    r = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_without_torch_xla_import_distkit_touches_nothing_xla():
    assert importlib.util.find_spec("torch_xla") is None, "the main environment must not have torch_xla"
    out = python("import sys, distkit; print(distkit.compat.shims.APPLIED, 'torch_xla' in sys.modules)")
    assert out == "['fork_safe_cuda_check'] False"


def test_fork_safe_cuda_check_is_set_on_import_unless_the_user_chose():
    code = "import os, distkit; print(os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK'), distkit.compat.shims.APPLIED)"
    assert python(code) == "1 ['fork_safe_cuda_check']"
    assert python(code, PYTORCH_NVML_BASED_CUDA_CHECK="0") == "0 []"
    assert python(code, DISTKIT_NO_COMPAT="1") == "None []"
    env = {}
    assert compat.fork_safe_cuda_check(env) is True and env == {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
    assert compat.fork_safe_cuda_check(env) is False


# --- stand-ins shaped like ignite 0.5.5's _XlaDistModel and torch-xla 2.9's modules -----

xm = None  # the stand-in methods below look this global up, as ignite's look up its xm


def make_model_cls():
    class XlaDistModel:  # the three methods exactly as ignite 0.5.5 writes them
        def get_local_rank(self):
            return xm.get_local_ordinal()

        def get_rank(self):
            return xm.get_ordinal()

        def get_world_size(self):
            return xm.xrt_world_size()

    return XlaDistModel


RUNTIME_2_9 = types.SimpleNamespace(world_size=lambda: 8, global_ordinal=lambda: 3, local_ordinal=lambda: 1)


def test_rank_and_world_size_are_rerouted_to_torch_xla_runtime_when_xla_model_lost_them():
    global xm
    xm = types.SimpleNamespace(get_local_ordinal=lambda: 1)  # 2.9: only this one is left
    cls = make_model_cls()
    with pytest.raises(AttributeError, match="xrt_world_size"):
        cls().get_world_size()  # the failure ignite shows with torch-xla >= 2.7
    assert compat.patch_rank_and_world_size(cls, xm, RUNTIME_2_9) is True
    m = cls()
    assert (m.get_world_size(), m.get_rank(), m.get_local_rank()) == (8, 3, 1)
    assert getattr(cls.get_rank, compat.SHIM_MARK) is True
    assert not hasattr(cls.get_local_rank, compat.SHIM_MARK)  # still present in xla_model
    assert compat.patch_rank_and_world_size(cls, xm, RUNTIME_2_9) is False  # idempotent


def test_rank_and_world_size_are_left_alone_where_xla_model_still_has_them():
    global xm
    xm = types.SimpleNamespace(xrt_world_size=lambda: 4, get_ordinal=lambda: 2, get_local_ordinal=lambda: 0)
    cls = make_model_cls()
    assert compat.patch_rank_and_world_size(cls, xm, RUNTIME_2_9) is False
    assert cls().get_world_size() == 4


def make_wrapper_cls(steps):
    from torch.optim import Optimizer

    class _XLADistributedOptimizer(Optimizer):  # as in ignite 0.5.5 (step: xm.optimizer_step)
        def __init__(self, optimizer):
            super().__init__(optimizer.param_groups)
            self.wrapped_optimizer = optimizer

        def step(self, closure=None):
            steps.append(self.wrapped_optimizer)
            self.wrapped_optimizer.step()

    return _XLADistributedOptimizer


def auto_optim_on_xla(optimizer, wrapper_cls):
    """What ignite 0.5.5's idist.auto_optim does on the xla-tpu backend."""
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(wrapper_cls.__dict__))
    return cls(optimizer)


def test_auto_optim_wrapper_super_is_repaired():
    steps = []
    wrapper_cls = make_wrapper_cls(steps)
    param = torch.nn.Parameter(torch.ones(2))
    sgd = torch.optim.SGD([param], lr=0.5, momentum=0.9)
    with pytest.raises(TypeError, match=r"super\(type, obj\)"):
        auto_optim_on_xla(sgd, wrapper_cls)
    assert compat.patch_optimizer_init(wrapper_cls) is True
    opt = auto_optim_on_xla(sgd, wrapper_cls)
    assert isinstance(opt, torch.optim.SGD) and opt.wrapped_optimizer is sgd
    assert opt.param_groups[0] is sgd.param_groups[0]  # an lr scheduler on opt reaches sgd
    param.grad = torch.ones(2)
    opt.step()
    assert steps == [sgd] and torch.allclose(param.detach(), torch.full((2,), 0.5))
    assert compat.patch_optimizer_init(wrapper_cls) is False


def test_pjrt_accepts_one_replica_or_every_device_and_says_so_otherwise():
    assert compat.pjrt_nprocs(1, 8) == 1
    assert compat.pjrt_nprocs(8, 8) is None  # xmp.spawn(nprocs=None): every device
    with pytest.raises(DistkitError) as e:
        compat.pjrt_nprocs(4, 8)
    msg = str(e.value)
    assert "\n" not in msg and "use --nproc-per-node 1 or 8" in msg


pjrt = types.SimpleNamespace()  # what the stand-in xmp.spawn hands over to, like torch-xla's
xmp = None  # looked up as a global by the stand-in spawns, as ignite's looks up its xmp


def test_ignite_spawn_is_translated_for_pjrt():
    global xmp
    calls = []

    def spawn(fn, args=(), nprocs=None, join=True, daemon=False, start_method="spawn", **unexpected):
        """Shaped like torch-xla 2.9's xmp.spawn, which hands over to pjrt.spawn."""
        assert pjrt is not None
        calls.append({"nprocs": nprocs, "start_method": start_method, "unexpected": unexpected})

    xmp = types.SimpleNamespace(spawn=spawn)

    class Model:  # spawn exactly as ignite 0.5.5's _XlaDistModel.spawn
        @staticmethod
        def _dist_worker_task_fn(local_rank, backend, fn, args, kwargs_dict):
            pass

        @staticmethod
        def spawn(fn, args, kwargs_dict=None, nproc_per_node=1, nnodes=1, node_rank=0, backend="xla-tpu", **kwargs):
            if "start_method" not in kwargs:
                kwargs["start_method"] = "fork"
            xmp.spawn(Model._dist_worker_task_fn, args=(backend, fn, args, kwargs_dict),
                      nprocs=nproc_per_node, **kwargs)

    Model.spawn(print, (), nproc_per_node=8, master_port=1234)
    assert calls.pop() == {"nprocs": 8, "start_method": "fork", "unexpected": {"master_port": 1234}}
    # ...which the real xmp.spawn refuses twice: nprocs 8 (PJRT: 1 or None) and master_port.

    assert compat.patch_pjrt_spawn(Model, xmp, lambda: 8) is True
    Model.spawn(print, (), nproc_per_node=8, master_port=1234, master_addr="x")
    Model.spawn(print, (), nproc_per_node=1)
    assert calls == [{"nprocs": None, "start_method": "fork", "unexpected": {}},
                     {"nprocs": 1, "start_method": "fork", "unexpected": {}}]
    with pytest.raises(DistkitError, match="--nproc-per-node 2 with xla-tpu"):
        Model.spawn(print, (), nproc_per_node=2)
    assert compat.patch_pjrt_spawn(Model, xmp, lambda: 8) is False  # already patched


def test_spawn_is_left_alone_when_xmp_spawn_is_not_pjrts():
    global xmp

    class Model:
        @staticmethod
        def spawn(fn, args, nproc_per_node=1, **kwargs):
            xmp.spawn(fn, args=args, nprocs=nproc_per_node, **kwargs)

    xmp = types.SimpleNamespace(spawn=lambda fn, args=(), nprocs=None, **kw: None)  # no pjrt in its code
    assert compat.patch_pjrt_spawn(Model, xmp, lambda: 8) is False


def test_the_xla_context_is_only_reported_once_the_runtime_runs():
    started = []

    class Model:  # create_from_context exactly as ignite 0.5.5's: always an XLA model
        @staticmethod
        def create_from_context():
            started.append(True)  # the real one starts the XLA runtime here
            return "xla model"

    xlac = types.SimpleNamespace(running=False)
    xlac._xla_runtime_is_initialized = lambda: xlac.running
    assert compat.patch_lazy_context(Model, xlac) is True
    assert Model.create_from_context() is None and started == []  # launcher: serial, runtime untouched
    xlac.running = True  # inside a replica, or after the user's own XLA tensors
    assert Model.create_from_context() == "xla model"
    assert compat.patch_lazy_context(Model, xlac) is False
    assert compat.patch_lazy_context(type("Old", (), {"create_from_context": staticmethod(lambda: 1)}),
                                     types.SimpleNamespace()) is False  # torch_xla without the probe


def test_tpu_chips_are_counted_from_the_pci_bus(tmp_path):
    def device(name, vendor, dev):
        d = tmp_path / "bus" / "pci" / "devices" / name
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "device").write_text(dev + "\n")

    assert compat.tpu_chips(str(tmp_path)) == {}
    device("0000:00:04.0", "0x1ae0", "0x0063")  # TPU v5e
    device("0000:00:05.0", "0x1ae0", "0x0063")
    device("0000:00:06.0", "0x1ae0", "0x0042")  # Google, but a network card (gVNIC)
    device("0000:00:07.0", "0x10de", "0x0063")  # NVIDIA
    assert compat.tpu_chips(str(tmp_path)) == {"v5e": 2}
    assert compat.tpu_chips() == {}  # this machine has no TPU
