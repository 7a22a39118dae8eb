"""Tiny DDP steps (8 samples per process, the kit's MLP) for N seconds, under the kit's
launcher (``distkit.launch.entry.launch_function``: ``idist.Parallel`` spawn, OMP_NUM_THREADS
and torch threads pinned) or joined under torchrun; rank 0 writes the steady steps/s.

    python benchmarks/tiny_steps_launchers.py 10 out.json
    python -m torch.distributed.run --nproc-per-node 2 benchmarks/tiny_steps_launchers.py 10 out.json

Only the steady loop is timed (after 20 warm-up steps and a barrier): start-up is not
in the number. Results: benchmarks/results/tiny-steps-launchers.txt."""
import os, sys, time, json
import torch, ignite.distributed as idist

def worker(local_rank, seconds, out):
    from torch.nn.parallel import DistributedDataParallel as DDP
    from distkit.builtin.models import MLP
    torch.manual_seed(0)
    model = idist.auto_model(MLP())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    def step():
        opt.zero_grad(); torch.nn.functional.cross_entropy(model(x), y).backward(); opt.step()
    for _ in range(20): step()
    idist.barrier()
    n, start = 0, time.perf_counter()
    while True:
        step(); n += 1
        if n % 50 == 0 and idist.all_reduce(float(time.perf_counter() - start > seconds)) > 0:
            break
    rate = n / (time.perf_counter() - start)
    if idist.get_rank() == 0:
        json.dump({"steps_per_s": rate, "threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS")}, open(out, "w"))

if __name__ == "__main__":
    from distkit.launch.entry import launch_function
    launch_function(worker, float(sys.argv[1]), sys.argv[2], backend="gloo",
                    nproc_per_node=None if "WORLD_SIZE" in os.environ else 2)
