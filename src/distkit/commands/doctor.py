"""``distkit doctor``: what this machine has, and the launch that suits it."""
from __future__ import annotations

import os
import platform


def report() -> dict:
    import ignite
    import ignite.distributed as idist
    import torch

    from distkit.launch import default_nproc, resolve_backend, tpu_available
    from distkit.launch import threads_per_process

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ignite": ignite.__version__,
        "cores": threads_per_process(1),
        "cuda_available": torch.cuda.is_available(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "tpu": tpu_available(),
        "backends": list(idist.available_backends()),
        "colab": "COLAB_RELEASE_TAG" in os.environ or "COLAB_GPU" in os.environ,
        "launched_by": ("torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else
                        "slurm" if "SLURM_JOB_ID" in os.environ else None),
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
            print(f"{key:<{width}}  {value}")
    rec = info["recommended"]
    print(f"\nrecommended: {rec['command']}  ({rec['threads_per_process']} thread(s) per process)")
    for tip in advice(info):
        print(f"- {tip}")
    return 0
