#!/usr/bin/env bash
# One command that proves the kit's GPU path on whatever NVIDIA machine it is given.
#
#   scripts/gpu_check.sh [--wheels DIR] [--output DIR] [--work DIR]
#   scripts/gpu_check.sh --steps trace,doctor ...       # the environment and those steps only
#   scripts/gpu_check.sh --install-only --wheels DIR    # install and check imports, no GPU needed
#   scripts/gpu_check.sh --make-wheels DIR              # on a machine WITH network: fill DIR
#   DRY_RUN=1 [DRY_RUN_GPUS=N] scripts/gpu_check.sh ... # print every step, run none
#   GPU_CHECK_REHEARSAL=1 scripts/gpu_check.sh --output DIR  # CPU rehearsal (tests): gloo
#       for nccl, 2 processes; steps that need a GPU are recorded as skipped, never passed
#
# Steps, each recorded (passed or failed, with its figures) even when another fails:
#   1. install  pytorch-ignite and distkit from the wheels in DIR, never from the network,
#               never replacing the preinstalled torch/torchvision (pinned by a constraint
#               file); then check the imports and that torch's version did not move
#   2. train    distkit train --backend nccl on 1 GPU, then on every GPU
#   3. amp      the same on every GPU with --amp (bf16 autocast), to the same accuracy
#   4. notebooks 02 and 07 executed with nbclient; their GPU cells must run, not skip
#   5. copy     host<->device bandwidth, pinned vs pageable (lessons.collectives.copy_bandwidth)
#   6. bench    distkit bench --only gpu: ResNet-18, bf16, channels_last, kit vs hand-written
#   7. too many processes: distkit train refuses GPUs+1 processes in one line, and without
#               that check rank GPUs (local rank = GPU count) fails on "invalid device
#               ordinal", as notebook 02 says
#   8. trace    the GPT at GPT-2 small's size (--set size=gpt2-small), bf16, --trace, on
#               every GPU: tokens/s, MFU, CUDA kernels in the merged trace; Holistic Trace
#               Analysis (temporal breakdown, communication/computation overlap) on the
#               per-rank traces when its wheels are in the folder (issue 34). A rehearsal
#               traces the default GPT on 2 CPU processes and leaves HTA out (it measures
#               GPU kernels, which a CPU trace has none of)
#   9. doctor   the hang doctor's record of a nccl rank (one process: the Flight Recorder's
#               entries of its collectives, op, shapes, dtypes, done, as the doctor reads them)
# Results: OUTPUT/gpu-check-<gpu>.json and .txt (GPU model, driver, torch, every figure);
# executed notebooks and run folders stay under --work. Exit 0 only when every step passed.
#
# The machine this is for has no network, and may have torch and torchvision preinstalled
# but not pytorch-ignite nor this package. Before going there, on a machine with network
# and the same Python version (or by hand, as the issue describes):
#   pip download pytorch-ignite --no-deps -d wheels/
#   pip wheel --no-deps . -w wheels/
# plus, if that machine lacks them, wheels of matplotlib, scikit-learn, tqdm, nbclient,
# nbformat and ipykernel (--make-wheels DIR does all of it).
set -euo pipefail

usage() { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "gpu_check: error: $*" >&2; exit 1; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WHEELS="" OUTPUT="$ROOT/benchmarks/results" WORK="" INSTALL_ONLY=0 MAKE_WHEELS=""
DRY_RUN="${DRY_RUN:-0}"
while [ $# -gt 0 ]; do
    case "$1" in
        --wheels) WHEELS="${2:?--wheels needs a folder}"; shift 2 ;;
        --output) OUTPUT="${2:?--output needs a folder}"; shift 2 ;;
        --work) WORK="${2:?--work needs a folder}"; shift 2 ;;
        --steps) export GPU_CHECK_STEPS="${2:?--steps needs words, comma-separated}"; shift 2 ;;
        --install-only) INSTALL_ONLY=1; shift ;;
        --make-wheels) MAKE_WHEELS="${2:?--make-wheels needs a folder}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1': see scripts/gpu_check.sh --help" ;;
    esac
done

run() {  # print a step's command; run it unless DRY_RUN=1
    echo "+ $*"
    [ "$DRY_RUN" = 1 ] || "$@"
}

if [ -n "$MAKE_WHEELS" ]; then
    [ "$DRY_RUN" = 1 ] || mkdir -p "$MAKE_WHEELS"
    run "$PYTHON" -m pip download pytorch-ignite --no-deps -d "$MAKE_WHEELS"
    run "$PYTHON" -m pip wheel --no-deps "$ROOT" -w "$MAKE_WHEELS"
    # what the kit and the notebook step need besides torch/torchvision (pinned out: the
    # GPU machine keeps its own); only binary wheels, which install without a compiler
    run "$PYTHON" -m pip download --only-binary=:all: -d "$MAKE_WHEELS" \
        matplotlib scikit-learn tqdm nbclient nbformat ipykernel HolisticTraceAnalysis
    exit 0
fi

# --- is there a GPU? Answer fast, before importing anything -----------------------------
gpu_count() {
    if [ "$DRY_RUN" = 1 ]; then echo "${DRY_RUN_GPUS:-1}"; return; fi
    if ! command -v nvidia-smi >/dev/null 2>&1 && ! [ -e /dev/nvidia0 ]; then echo 0; return; fi
    "$PYTHON" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0
}
REHEARSAL="${GPU_CHECK_REHEARSAL:-0}"
if [ "$REHEARSAL" = 1 ]; then
    [ "$OUTPUT" != "$ROOT/benchmarks/results" ] || die "a rehearsal needs --output DIR: its results are not GPU results"
    GPUS=2
elif [ "$INSTALL_ONLY" = 0 ]; then
    GPUS="$(gpu_count)"
    [ "$GPUS" -gt 0 ] 2>/dev/null || die "no NVIDIA GPU visible here (nvidia-smi, /dev/nvidia0 and torch.cuda.device_count() say none): run it on a machine with one; nothing was installed or written"
fi

# --- 1. install from the wheel folder ---------------------------------------------------
install_from_wheels() {
    [ -d "$WHEELS" ] || die "--wheels $WHEELS is not a folder: pass the folder made with --make-wheels"
    ls "$WHEELS"/pytorch_ignite-*.whl >/dev/null 2>&1 || die "no pytorch_ignite-*.whl in $WHEELS: pip download pytorch-ignite --no-deps -d $WHEELS (on a machine with network)"
    ls "$WHEELS"/distkit-*.whl >/dev/null 2>&1 || die "no distkit-*.whl in $WHEELS: pip wheel --no-deps . -w $WHEELS (in this repository)"
    local constraints before after
    constraints="$(mktemp)"
    # Pin what is preinstalled: pip may then resolve distkit's other dependencies from the
    # folder, but can never replace torch or torchvision (it stops with an error instead).
    "$PYTHON" - >"$constraints" <<'PY'
from importlib.metadata import PackageNotFoundError, version
for name in ("torch", "torchvision"):
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        pass
PY
    before="$(cat "$constraints" | tr '\n' ' ')"
    echo "preinstalled (pinned): ${before:-none}"
    # The notebook steps run nbclient in this Python: install it (and its kernel) when the
    # folder has it, as --make-wheels leaves it; otherwise those steps fail naming nbclient.
    local notebook_tools=()
    for name in nbclient nbformat ipykernel holistictraceanalysis; do
        # (HolisticTraceAnalysis's wheel is spelt either way)
        if ls "$WHEELS"/$name-*.whl >/dev/null 2>&1 || ls "$WHEELS" | grep -qi "^$name-.*\.whl$"; then
            notebook_tools+=("$name")
        fi
    done
    if ! "$PYTHON" -m pip install --no-index --find-links "$WHEELS" -c "$constraints" \
            --disable-pip-version-check -q "$WHEELS"/pytorch_ignite-*.whl "$WHEELS"/distkit-*.whl \
            "${notebook_tools[@]}" 2>"$constraints.err"; then
        die "pip could not install from $WHEELS without the network: $(grep -m1 -i 'error' "$constraints.err" || tail -n1 "$constraints.err"): add the missing wheels to $WHEELS (--make-wheels does)"
    fi
    "$PYTHON" - "$constraints" <<'PY' || exit 1
import sys
from importlib.metadata import version

pins = dict(line.strip().split("==") for line in open(sys.argv[1]) if line.strip())
moved = {n: (v, version(n)) for n, v in pins.items() if version(n) != v}
if moved:
    sys.exit(f"gpu_check: error: the install changed {moved}: it must not; report this")
missing = []
for module in ("torch", "ignite", "distkit", "distkit.commands", "matplotlib", "sklearn", "tqdm"):
    try:
        __import__(module)
    except Exception as e:  # noqa: BLE001 - name the module and why
        missing.append(f"{module} ({type(e).__name__}: {e})")
if missing:
    sys.exit("gpu_check: error: installed, but these do not import: " + "; ".join(missing)
             + ": add their wheels to the folder (--make-wheels does)")
import distkit, ignite, torch  # noqa: E401
print(f"installed: distkit {distkit.__version__}, ignite {ignite.__version__}; torch {torch.__version__} untouched")
PY
    rm -f "$constraints" "$constraints.err"
}
if [ -n "$WHEELS" ]; then
    if [ "$DRY_RUN" = 1 ]; then
        echo "+ $PYTHON -m pip install --no-index --find-links $WHEELS -c <torch/torchvision pins> $WHEELS/pytorch_ignite-*.whl $WHEELS/distkit-*.whl"
    else
        install_from_wheels
    fi
elif [ "$INSTALL_ONLY" = 1 ]; then
    die "--install-only needs --wheels DIR"
fi
[ "$INSTALL_ONLY" = 1 ] && exit 0

# --- 2-7: the GPU steps, recorded into one JSON -----------------------------------------
if [ "$DRY_RUN" = 1 ]; then
    WORK="${WORK:-<a new temporary folder>}"  # a dry run writes nothing
else
    [ -n "$WORK" ] || WORK="$(mktemp -d -t distkit-gpu-check-XXXXXX)"
    mkdir -p "$WORK" "$OUTPUT"
fi
export DRY_RUN GPUS WORK OUTPUT ROOT REHEARSAL
cd "$ROOT"
exec "$PYTHON" - <<'PY'
import json
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

DRY = os.environ["DRY_RUN"] == "1"
REHEARSAL = os.environ["REHEARSAL"] == "1"  # on a CPU, for the tests: gloo, no GPU steps
BACKEND = "gloo" if REHEARSAL else "nccl"
GPUS = int(os.environ["GPUS"])
WORK, OUTPUT, ROOT = Path(os.environ["WORK"]), Path(os.environ["OUTPUT"]), Path(os.environ["ROOT"])
PY = sys.executable
EXPECTED_ACCURACY = 0.95  # the default digits CNN reaches 0.98 in 10 epochs (README, CPU)
# A rehearsal checks the plumbing (commands, results.json, the report), not the numbers:
# 2 epochs, and only "learned something" (10 classes: chance is 0.1).
REHEARSAL_TRAIN = ["--epochs", "2"] if REHEARSAL else []
if REHEARSAL:
    EXPECTED_ACCURACY = 0.5
BENCH_TARGET = 0.95       # kit images/s over hand-written (issue 15)
steps, results = [], {}


def step(name, needs_gpu=False):
    def register(fn):
        steps.append((name, fn, needs_gpu))
        return fn
    return register


def sh(args, timeout, check=True):
    """Run a command, print it first; in a dry run only print it."""
    print("+ " + " ".join(map(str, args)), flush=True)
    if DRY:
        return None
    done = subprocess.run(list(map(str, args)), capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}: {(done.stderr.strip() or done.stdout.strip())[-800:]}")
    return done


def train(name, nproc, *extra):
    out = WORK / name
    sh([PY, "-m", "distkit", "train", "--backend", BACKEND, "--nproc-per-node", nproc,
        "--no-progress", "--output-dir", out, *REHEARSAL_TRAIN, *extra], timeout=900)
    if DRY:
        return {}
    (run_json,) = out.glob("*/results.json")
    r = json.loads(run_json.read_text())
    acc = r["final"]["val_accuracy"]
    assert r["backend"] == BACKEND and r["world_size"] == nproc, (r["backend"], r["world_size"])
    assert acc >= EXPECTED_ACCURACY, f"validation accuracy {acc:.4f} < {EXPECTED_ACCURACY}"
    return {"world_size": r["world_size"], "device": r["device"], "val_accuracy": acc,
            "val_loss": r["final"].get("val_loss"), "epochs": r["epochs_completed"],
            "seconds_per_epoch": r["seconds_per_epoch"], "samples_per_second": r["samples_per_second"],
            "wall_time_s": r.get("wall_time_s"), "amp": r["config"].get("amp")}


def _nccl_version(torch):
    v = torch.cuda.nccl.version()  # a tuple in recent torch, an int in older ones
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


@step("environment")
def environment():
    if REHEARSAL:
        smi = None
        gpus = [{"name": "CPU rehearsal", "driver": None, "memory": None}]
    else:
        smi = sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"], 30)
    if DRY:
        return {}
    import ignite
    import torch

    import distkit

    if smi is not None:
        gpus = [dict(zip(("name", "driver", "memory"), map(str.strip, line.split(","))))
                for line in smi.stdout.strip().splitlines()]
    cuda = torch.cuda.is_available()
    return {"gpus": gpus, "gpu_count": torch.cuda.device_count(), "driver": gpus[0]["driver"],
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if cuda else None,
            "nccl": _nccl_version(torch) if cuda else None,
            "bf16_supported": torch.cuda.is_bf16_supported() if cuda else None,
            "ignite": ignite.__version__, "distkit": distkit.__version__,
            "python": sys.version.split()[0]}


@step(f"train {BACKEND}, 1 GPU")
def train_one():
    return train("train-1gpu", 1)


if GPUS > 1:  # with one GPU, "every GPU" is the run above
    @step(f"train {BACKEND}, every GPU ({GPUS})")
    def train_all():
        return train(f"train-{GPUS}gpu", GPUS)


@step(f"train {BACKEND} --amp (bf16), every GPU ({GPUS})")
def train_amp():
    return train(f"train-{GPUS}gpu-amp", GPUS, "--amp")


def notebook(stem, must_show, must_not_show):
    path = ROOT / "notebooks" / f"{stem}.ipynb"
    print(f"+ nbclient: execute {path.relative_to(ROOT)} -> {WORK / path.name}", flush=True)
    if DRY:
        return {}
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    folder = WORK / f"nb-{stem}"
    folder.mkdir(exist_ok=True)
    start = time.perf_counter()
    try:
        NotebookClient(nb, timeout=900, kernel_name="python3",
                       resources={"metadata": {"path": str(folder)}}).execute()
    finally:
        nbformat.write(nb, WORK / path.name)  # the executed notebook, outputs and all
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.get("outputs", []))
    for pattern in must_show:
        assert re.search(pattern, text), f"{stem}: no output matches {pattern!r}"
    for pattern in must_not_show:
        assert not re.search(pattern, text), f"{stem}: a GPU cell was skipped ({pattern!r})"
    return {"executed": str(WORK / path.name), "seconds": round(time.perf_counter() - start, 1),
            "checked": {"shows": must_show, "does_not_show": must_not_show}}


@step("notebook 02 (GPU cells)", needs_gpu=True)
def notebook_02():
    return notebook("02_gpus_with_nccl", [rf"{GPUS} GPU\(s\): backend nccl", r"cuda:0 +pinned"],
                    [r"No GPU on this runtime"])


@step("notebook 07 (GPU cell)", needs_gpu=True)
def notebook_07():
    return notebook("07_timing_with_timer", [r"matmul: [0-9.]+ ms to launch, [0-9.]+ ms to finish"],
                    [r"GPU demonstration skipped"])


@step("copy bandwidth, pinned vs pageable", needs_gpu=True)
def copy():
    print("+ distkit.lessons.collectives.copy_bandwidth('cuda:0', (1, 16, 64), pin_memory=True/False)")
    if DRY:
        return {}
    from distkit.lessons.collectives import copy_bandwidth

    rows = {pinned: copy_bandwidth("cuda:0", (1, 16, 64), repeats=10, pin_memory=pinned)
            for pinned in (True, False)}
    by_size = {}
    for pinned, table in rows.items():
        for row in table:
            by_size.setdefault(row["megabytes"], {})["pinned" if pinned else "pageable"] = {
                k: row[k] for k in ("host_to_device_GBps", "host_to_device_ms", "device_to_host_ms")}
    big = by_size[64]
    ratio = big["pinned"]["host_to_device_GBps"] / big["pageable"]["host_to_device_GBps"]
    return {"by_megabytes": by_size, "pinned_over_pageable_64MB": round(ratio, 2)}


@step("distkit bench --only gpu", needs_gpu=True)
def bench():
    out = WORK / "bench"
    sh([PY, "-m", "distkit", "bench", "--quick", "--only", "gpu", "--output", out,
        "--note", "scripts/gpu_check.sh"], timeout=900)
    if DRY:
        return {}
    (path,) = out.glob("bench-*.json")
    gpu = json.loads(path.read_text())["gpu"]
    assert "skipped" not in gpu, gpu.get("skipped")
    ratio = gpu["ratio"]  # median over rounds of kit/hand-written images per second
    assert ratio >= BENCH_TARGET, f"kit/hand-written {ratio:.3f} < {BENCH_TARGET}"
    return gpu


@step("more processes than GPUs: one line from distkit train")
def too_many_refused():
    start = time.perf_counter()
    # a global batch that divides by GPUS + 1, so that the GPU count is what gets refused
    done = sh([PY, "-m", "distkit", "train", "--backend", "nccl", "--nproc-per-node", GPUS + 1,
               "--batch-size", 16 * (GPUS + 1), "--output-dir", WORK / "too-many"], timeout=120, check=False)
    if DRY:
        return {}
    took = time.perf_counter() - start
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and lines[0].startswith("distkit: error:"), done.stderr[-800:]
    assert "GPU" in lines[0], lines[0]  # refused for the GPU count, not for something else
    assert not (WORK / "too-many").exists() or not any((WORK / "too-many").iterdir()), "it wrote a run folder"
    return {"exit_code": done.returncode, "message": lines[0], "seconds": round(took, 2)}


PER_RANK = r'''
import json
import sys
from datetime import timedelta

import ignite.distributed as idist


def fn(local_rank):
    idist.barrier()


if __name__ == "__main__":  # spawned ranks import this file
    try:
        with idist.Parallel(backend="nccl", nproc_per_node=int(sys.argv[1]), start_method="spawn",
                            timeout=timedelta(seconds=120)) as p:
            p.run(fn)
        print("INDEX none: every rank started")
    except Exception as e:
        print("INDEX", getattr(e, "error_index", None))
        print("ERROR", json.dumps(str(e)))  # all of it: CUDA's message ends in debugging hints
'''


@step("more processes than GPUs: the failing rank, without the check", needs_gpu=True)
def too_many_per_rank():
    # What notebook 02 says happens without distkit's preflight: ignite calls
    # torch.cuda.set_device(local_rank) right after creating the process group, and local
    # rank <GPU count> fails with "invalid device ordinal".
    script = WORK / "more_processes_than_gpus.py"
    if not DRY:
        script.write_text(PER_RANK)
    done = sh([PY, script, GPUS + 1], timeout=300, check=False)
    if DRY:
        return {}
    index = re.search(r"^INDEX (\S+)", done.stdout, re.M)
    error = re.search(r"^ERROR (.*)$", done.stdout, re.M)
    assert index and error, f"no failure reported: {done.stdout[-400:]} {done.stderr[-400:]}"
    text = json.loads(error.group(1))
    assert index.group(1) == str(GPUS), f"failing local rank {index.group(1)}, expected {GPUS}: {text[-400:]}"
    line = next((ln.strip() for ln in text.splitlines() if "invalid device ordinal" in ln.lower()), None)
    assert line, f"no 'invalid device ordinal' in the failing rank's error: {text[-600:]}"
    return {"failing_local_rank": int(index.group(1)), "error": line}


TRACE_SIZE = "default" if REHEARSAL else "gpt2-small"


@step(f"trace: the GPT ({TRACE_SIZE}), bf16, every GPU ({GPUS})")
def trace_gpt():
    out = WORK / "trace-gpt"
    per_process = 2 if REHEARSAL else 8  # blocks of the model's context per process and step
    sh([PY, "-m", "distkit", "train", "--backend", BACKEND, "--nproc-per-node", GPUS,
        "--dataset", "text", "--model", "gpt", "--set", f"size={TRACE_SIZE}", "--amp", "--trace",
        "--max-iters", 12, "--batch-size", per_process * GPUS, "--no-progress",
        "--output-dir", out], timeout=900)
    if DRY:
        return {}
    (run_json,) = out.glob("*/results.json")
    r = json.loads(run_json.read_text())
    trace = r["trace"]
    assert Path(trace["merged"]).exists() and Path(trace["png"]).exists(), trace
    events = json.loads(Path(trace["merged"]).read_text())["traceEvents"]
    kernels = sum(1 for e in events if e.get("cat") == "kernel")
    assert REHEARSAL or kernels > 0, "no CUDA kernel in the merged trace"
    t = r["throughput"]
    figures = {"size": TRACE_SIZE, "world_size": r["world_size"], "tokens_per_second": r["tokens_per_second"],
               "mfu": r["mfu"], "peak_flops": t["peak_flops"], "peak_flops_source": t["peak_flops_source"],
               "step_time_s": t["step_time_s"], "flops_per_token": t["flops_per_token"],
               "cuda_kernels_in_merged_trace": kernels, "trace": trace,
               "compare": "picotron's published MFU: 38-50 % on H100s"}
    figures["hta"] = ({"skipped": "a CPU trace has no GPU kernels, which HTA measures"} if REHEARSAL
                      else holistic_trace_analysis(trace["per_rank"]))
    return figures


DOCTOR_RECORDS = r"""
import json, sys, tempfile, time
import torch
import torch.distributed as dist
from distkit.observe.hang_records import live_record

backend = sys.argv[1]
dist.init_process_group(backend, init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
x = torch.ones(1000, device="cuda:0" if backend == "nccl" else "cpu")
dist.all_reduce(x)
dist.broadcast(x, 0)
dist.all_gather([torch.empty_like(x)], x)
if backend == "nccl":
    torch.cuda.synchronize()
deadline = time.monotonic() + 10  # the recorder marks a collective done a moment after it ends
while not all(c["done"] for c in live_record(0, None)["collectives"]) and time.monotonic() < deadline:
    time.sleep(0.05)
import torch._C._distributed_c10d as c10d
for name in ("_dump_fr_trace_json", "_dump_nccl_trace_json"):
    if hasattr(c10d, name):
        print("DUMP", name, len(json.loads(getattr(c10d, name)()).get("entries", [])), "entries")
print("RECORD", json.dumps(live_record(0, None)))
dist.destroy_process_group()
"""


@step(f"hang doctor: a rank's record on {BACKEND}")
def doctor_records():
    # What the doctor knows of a rank is its record: the Flight Recorder's entries of the
    # rank's process group (op, shapes, dtypes, done) and the rank's Python stack. One
    # process: the record's reading, which needs no second GPU; a disagreement between
    # ranks needs two GPUs (nccl refuses two ranks on one).
    script = WORK / "doctor_records.py"
    if not DRY:
        script.write_text(DOCTOR_RECORDS)
    done = sh([PY, script, BACKEND], timeout=300)
    if DRY:
        return {}
    print(*[ln for ln in done.stdout.splitlines() if ln.startswith("DUMP ")], sep="\n")
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("RECORD ")]
    record = json.loads(line[len("RECORD "):])
    seen = [(c["op"], c["shapes"], c["dtypes"], c["done"]) for c in record["collectives"]]
    assert record["state"] == "computing", record
    assert seen, [ln for ln in done.stdout.splitlines() if ln.startswith("DUMP ")]
    assert [op.replace("_", "")[:6] for op, *_ in seen] == ["allred", "broadc", "allgat"], seen
    assert all(shapes[0] == [1000] and dtypes[0] == "float32" and done
               for _, shapes, dtypes, done in seen), seen
    return {"collectives": record["collectives"]}


def holistic_trace_analysis(per_rank):
    """HTA's temporal breakdown and communication/computation overlap per rank, on a
    folder holding only the per-rank traces (HTA reads every trace in its folder)."""
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return {"skipped": "HolisticTraceAnalysis is not installed: put its wheels in the folder (--make-wheels does)"}
    import shutil

    folder = WORK / "hta-input"
    folder.mkdir(exist_ok=True)
    for path in per_rank:
        shutil.copy(path, folder)
    analysis = TraceAnalysis(trace_dir=str(folder))
    figures = {}
    for name, analyse in (("temporal_breakdown", analysis.get_temporal_breakdown),
                          ("comm_comp_overlap", analysis.get_comm_comp_overlap)):
        try:  # HTA's own assertions can fail on a trace: the step's other figures stand
            figures[name] = analyse(visualize=False).to_dict("records")
        except Exception as e:  # noqa: BLE001 - recorded, with HTA's traceback's last line
            figures[name] = {"failed": f"{type(e).__name__}: {e}",
                             "at": traceback.format_exc().strip().splitlines()[-3].strip()}
    return figures


started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
ONLY = [w for w in os.environ.get("GPU_CHECK_STEPS", "").split(",") if w]
if ONLY:  # the environment always, then the steps named (a rerun of those that failed)
    steps = [s for s in steps if s[0] == "environment" or any(w in s[0] for w in ONLY)]
for name, fn, needs_gpu in steps:
    print(f"== {name}", flush=True)
    if REHEARSAL and needs_gpu:
        results[name] = {"passed": None, "skipped": "needs a GPU: not rehearsed on a CPU"}
        print("   skipped: needs a GPU", flush=True)
        continue
    t0 = time.perf_counter()
    try:
        figures = fn()
        results[name] = {"passed": True, **(figures or {})}
    except Exception as e:  # record it and go on: one failing step must not hide the others
        results[name] = {"passed": False, "error": f"{type(e).__name__}: {e}",
                         "traceback": traceback.format_exc()[-2000:]}
        print(f"   FAILED: {type(e).__name__}: {e}", flush=True)
    results[name]["step_seconds"] = round(time.perf_counter() - t0, 1)

if DRY:
    print(f"dry run: {len(steps)} steps listed, nothing run; results would go to "
          f"{OUTPUT}/gpu-check-<gpu>.json and .txt")
    sys.exit(0)

env = results["environment"]
gpu = env.get("gpus", [{"name": "unknown"}])[0]["name"]
slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-") or "gpu"
ran = [r for r in results.values() if r["passed"] is not None]
passed = all(r["passed"] for r in ran)
record = {"started": started, "rehearsal": REHEARSAL, "gpu": gpu, "gpu_count": GPUS, "driver": env.get("driver"),
          "torch": env.get("torch"), "passed": passed, "work_dir": str(WORK), "steps": results}
record["steps_named"] = ONLY  # empty: every step
slug += "-steps" if ONLY else ""  # a rerun of some steps never replaces a whole check's record
json_path, text_path = OUTPUT / f"gpu-check-{slug}.json", OUTPUT / f"gpu-check-{slug}.txt"
json_path.write_text(json.dumps(record, indent=2) + "\n")
lines = [f"gpu_check {started}: {GPUS} x {gpu}, driver {env.get('driver')}, torch {env.get('torch')}, "
         f"CUDA {env.get('cuda')}, ignite {env.get('ignite')}, distkit {env.get('distkit')}"]
for name, r in results.items():
    if r["passed"] is None:
        lines.append(f"skip {name}: {r['skipped']}")
        continue
    if not r["passed"]:
        # one line: a failed cell's error is pages long; its exception's own line says it
        said = [ln for ln in re.sub(r"\x1b\[[0-9;]*m", "", r["error"]).splitlines() if ln.strip()]
        named = [ln for ln in said if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", ln)]
        lines.append(f"FAIL {name}: {(named or said or ['?'])[-1].strip()}")
        continue
    detail = ""
    if "val_accuracy" in r:
        detail = (f"val accuracy {r['val_accuracy']:.4f}, {r['seconds_per_epoch']:.2f} s/epoch, "
                  f"{r['samples_per_second']:.0f} samples/s")
    elif "pinned_over_pageable_64MB" in r:
        p, q = r["by_megabytes"][64]["pinned"], r["by_megabytes"][64]["pageable"]
        detail = (f"64 MB host->device: pinned {p['host_to_device_GBps']:.1f} GB/s, pageable "
                  f"{q['host_to_device_GBps']:.1f} GB/s (x{r['pinned_over_pageable_64MB']})")
    elif "sides" in r:
        detail = "kit vs hand-written: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()
                                                     if "ratio" in k and not isinstance(v, (dict, list)))
    elif "message" in r:
        detail = f"{r['message']} ({r['seconds']} s)"
    elif "mfu" in r:
        detail = (f"{r['tokens_per_second']:.0f} tokens/s, MFU {r['mfu']:.1%} of {r['peak_flops']:.3g} FLOP/s "
                  f"({r['peak_flops_source']}), {r['cuda_kernels_in_merged_trace']} CUDA kernels traced")
    elif "collectives" in r:
        detail = "recorded " + ", ".join(f"#{c['seq']} {c['op']}" for c in r["collectives"])
    elif "failing_local_rank" in r:
        detail = f"local rank {r['failing_local_rank']}: {r['error']}"
    lines.append(f"ok   {name}" + (f": {detail}" if detail else ""))
lines.append(f"{'PASSED' if passed else 'FAILED'}: {sum(bool(r['passed']) for r in ran)} of "
             f"{len(ran)} steps" + (f" ({len(results) - len(ran)} skipped)" if len(ran) < len(results) else "")
             + f"; {json_path}")
text_path.write_text("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(0 if passed else 1)
PY
