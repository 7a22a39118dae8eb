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
        "load_average": round(os.getloadavg()[0], 1),  # processes running or waiting, last minute
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


# What each compatibility shim (distkit.compat.shims) does, for a person reading doctor.
SHIM_WORDS = {
    "fork_safe_cuda_check": "the GPU check asks NVML, so processes forked later can still use CUDA",
    "xla_rank_and_world_size": "ignite's xla-tpu backend reads rank and world size from torch-xla's new API",
    "xla_optimizer_init": "ignite's XLA optimizer step fixed for this torch-xla",
    "xla_pjrt_spawn": "ignite's XLA launcher starts processes the way PJRT expects",
    "xla_lazy_context": "ignite's XLA context set up lazily, as this torch-xla needs",
}
CPU_TORCH = "pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu"


def loaded(info: dict) -> bool:
    """More processes want the CPU than it has cores: every timing is slower than alone."""
    return info["load_average"] > info["cores"]


def cuda_build_without_gpu(info: dict) -> bool:
    return bool(info["torch_build"]["cuda"]) and not info["cuda_available"]


def advice(info: dict) -> list[str]:
    tips = []
    if not info["cuda_available"] and not info["tpu"]:
        tips.append("no GPU or TPU: training runs on CPU processes with gloo; that is fine "
                    "for learning, and the same code runs on GPUs unchanged")
    if cuda_build_without_gpu(info) and not info["colab"]:
        tips.append(f"this torch is a CUDA {info['torch_build']['cuda']} build (with its NVIDIA libraries, "
                    "about 5 GB) on a machine with no GPU: the CPU-only build does the same here in a "
                    f"fraction of the space: {CPU_TORCH}")
    if loaded(info):
        tips.append(f"this machine is loaded: {info['load_average']} processes want its {info['cores']} "
                    "core(s) (1-minute load average), so every timing you take (epoch times, "
                    "samples per second, the notebooks' measurements) comes out slower than on a "
                    "quiet machine; compare timings taken at the same load")
    if info["colab"] and not info["cuda_available"]:
        tips.append("in Colab, Runtime > Change runtime type > GPU gives you nccl")
    if info["cores"] < 2:
        tips.append("only one core: several processes will take turns on it; expect no speed-up")
    if isinstance(info["torchvision"], str) and info["torchvision"].startswith("not"):
        tips.append("torchvision does not import: install the torchvision that matches your torch")
    return tips


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def described(info: dict) -> list[tuple[str, str]]:
    """The report as (label, text) lines in plain words (``--json`` keeps the keys)."""
    build = info["torch_build"]
    torch = info["torch"] + (f" (a CUDA {build['cuda']} build: cuDNN {build['cudnn']}, NCCL {build['nccl']})"
                             if build["cuda"] else " (a CPU-only build)")
    ram = info["ram_gib"]
    gpus = _shown(info["gpus"]) if info["gpus"] else "none" + (" (this torch could use one)" if build["cuda"] else "")
    launched = info["launched_by"] or "this command (no torchrun or SLURM around it)"
    shims = [SHIM_WORDS.get(name, name) for name in info["compat_applied"]]
    return [
        ("distkit", info["distkit"]),
        ("Python", f"{info['python']} on {info['os']}"),
        ("torch", torch),
        ("torchvision", info["torchvision"]),
        ("ignite", info["ignite"]),
        ("torch-xla", info["torch_xla"] or "not installed (needed on a TPU only)"),
        ("memory", f"{ram['total']} GiB, {ram['available']} GiB free" if ram["available"] is not None
         else f"{ram['total']} GiB"),
        ("CPU cores", str(info["cores"])),
        ("load", f"{info['load_average']} on {info['cores']} core(s), last minute: "
                 + ("loaded, timings will be slow" if loaded(info) else "quiet enough")),
        ("GPUs", gpus),
        ("TPU", "yes" if info["tpu"] else "none"),
        ("backends", f"{_shown(info['backends'])} usable here (built into torch: {_shown(info['backends_built'])})"),
        ("Colab", "yes" if info["colab"] else "no"),
        ("launched by", launched),
        ("launch variables", _shown(info["environment"]) if info["environment"] else "none set"),
        ("fixes applied", "; ".join(shims) or "none needed"),
        ("network", info["network"]),
    ]


def main(args) -> int:
    import json

    info = report()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    lines = described(info)
    width = max(len(label) for label, _ in lines)
    for label, text in lines:
        print(f"{label:<{width}}  {text}")
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
