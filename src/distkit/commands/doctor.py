"""``distkit doctor``: what this machine has, and the launch that suits it."""
from __future__ import annotations

import os
import platform

from distkit.host import layout

# Variables a launcher sets (torchrun, idist.Parallel, SLURM's srun, torch-xla) or that
# change how processes start; doctor shows those set, so a learner sees what a run will join.
LAUNCHER_VARIABLES = layout.LAUNCHER_VARIABLES + ("CUDA_VISIBLE_DEVICES", "PJRT_DEVICE")


def launcher_environment(environ=os.environ) -> dict:
    """The launcher variables set here, and every ``SLURM_*`` one."""
    return layout.launcher_variables(environ, LAUNCHER_VARIABLES)


def memory_gib() -> dict:
    """Total and available RAM (Linux: /proc/meminfo; elsewhere the total from sysconf)."""
    try:
        with open("/proc/meminfo") as f:
            kib = {line.split(":")[0]: int(line.split()[1]) for line in f if line.split()[1:]}
        return {"total": round(kib["MemTotal"] / 2**20, 1), "available": round(kib["MemAvailable"] / 2**20, 1)}
    except (OSError, KeyError, ValueError):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return {"total": round(total / 2**30, 1), "available": None}


def torch_build(torch) -> dict:
    """The CUDA, cuDNN and NCCL versions this torch was built with (None: not in this build)."""
    build = {"cuda": torch.version.cuda, "cudnn": None, "nccl": None}
    try:
        v = torch.backends.cudnn.version()  # 92600 is 9.26.0; before cuDNN 9, 8907 was 8.9.7
        if v:
            major, rest = (v // 10000, v % 10000) if v >= 90000 else (v // 1000, v % 1000)
            build["cudnn"] = f"{major}.{rest // 100}.{rest % 100}"
    except Exception:  # a CPU build, or the library does not load
        pass
    try:
        build["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:
        pass
    return build


def network_interface(environ=os.environ) -> str:
    """The interface a multi-node run would bind gloo (nccl) to from here: the one that
    routes to ``MASTER_ADDR`` if set, else to the default route, as the launcher picks it
    (:func:`distkit.host.facts.socket_interface`)."""
    from distkit.errors import DistkitError
    from distkit.host.facts import socket_interface

    backend = "nccl" if environ.get("NCCL_SOCKET_IFNAME") and not environ.get("GLOO_SOCKET_IFNAME") \
        else "gloo"
    master = layout.launcher_variables(environ).get("MASTER_ADDR")
    target = master or "198.51.100.1"  # any outside address: the default route's interface
    try:
        pick = socket_interface(backend, target, environ)
    except DistkitError:
        return f"no interface routes to {master or 'outside this host'}"
    if pick["set_by"] == "you":
        return f"{pick['variable']}={pick['interface']} (set by you)"
    towards = f"routes to the master {master}" if master else "on the default route"
    return (f"{pick['variable']}={pick['interface']} ({pick['address']}, {towards}): "
            "what distkit sets on several nodes")


def report() -> dict:
    import ignite
    import ignite.distributed as idist
    import torch

    import distkit
    from distkit.compat.shims import APPLIED
    from distkit.launch.checks import default_nproc, resolve_backend
    from distkit.host.facts import threads_per_process, tpu_available

    gpus = [{"name": torch.cuda.get_device_name(i),
             "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)}
            for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    tpu = tpu_available()
    built = list(idist.available_backends())
    # Built into torch is not usable here: nccl needs a visible GPU, xla-tpu a TPU.
    usable = [b for b in built if (b != "nccl" or gpus) and (b != "xla-tpu" or tpu)]
    info = {
        "distkit": distkit.__version__,
        "python": platform.python_version(),
        "os": platform.platform(),
        "ram_gib": memory_gib(),
        "torch": torch.__version__,
        "torch_build": torch_build(torch),
        "ignite": ignite.__version__,
        "cores": threads_per_process(1),
        "cuda_available": torch.cuda.is_available(),
        "gpus": gpus,
        "tpu": tpu,
        "backends": usable,
        "backends_built": built,
        "colab": "COLAB_RELEASE_TAG" in os.environ or "COLAB_GPU" in os.environ,
        "launched_by": layout.launched_by(),
        "environment": launcher_environment(),
        "compat_applied": list(APPLIED),
    }
    try:
        import torchvision

        info["torchvision"] = torchvision.__version__
    except Exception as e:
        info["torchvision"] = f"not importable ({type(e).__name__})"
    try:
        import torch_xla

        info["torch_xla"] = torch_xla.__version__
    except Exception:
        info["torch_xla"] = None
    backend = resolve_backend("auto")
    nproc = default_nproc(backend)
    info["network"] = network_interface()
    info["recommended"] = {
        "backend": backend,
        "nproc_per_node": nproc,
        "threads_per_process": threads_per_process(nproc),
        "command": f"distkit train --backend {backend} --nproc-per-node {nproc}",
    }
    return info


def advice(info: dict) -> list[str]:
    tips = []
    if not info["cuda_available"] and not info["tpu"]:
        tips.append("no GPU or TPU: training runs on CPU processes with gloo; that is fine "
                    "for learning, and the same code runs on GPUs unchanged")
    if info["colab"] and not info["cuda_available"]:
        tips.append("in Colab, Runtime > Change runtime type > GPU gives you nccl")
    if info["cores"] < 2:
        tips.append("only one core: several processes will take turns on it; expect no speed-up")
    if isinstance(info["torchvision"], str) and info["torchvision"].startswith("not"):
        tips.append("torchvision does not import: install the torchvision that matches your torch")
    return tips


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def main(args) -> int:
    import json

    info = report()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    width = max(len(k) for k in info)
    for key, value in info.items():
        if key != "recommended":
            print(f"{key:<{width}}  {_shown(value)}")
    rec = info["recommended"]
    print(f"\nrecommended: {rec['command']}  ({rec['threads_per_process']} thread(s) per process)")
    for tip in advice(info):
        print(f"- {tip}")
    return 0


def _shown(value) -> str:
    """A value on one line, for people: dicts as k=v, GPUs as 'name (N GiB)'."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "none"
    if isinstance(value, list):
        return ", ".join(f"{v['name']} ({v['memory_gib']} GiB)" if isinstance(v, dict) else str(v)
                         for v in value) or "none"
    return str(value)
