"""Worker start-up under idist.Parallel: spawn vs fork, from a parent that has already
imported what the kit's launcher imports. Prints seconds from the parent's start to the
moment both workers have imported distkit.train.training and passed a barrier, and the whole
command's time.

    python benchmarks/start_method.py spawn out.json
    python benchmarks/start_method.py fork out.json

Results: benchmarks/results/start-method.txt."""
import time
T0 = time.time()
import json, os, sys
import ignite.distributed as idist
import distkit.launch.entry  # noqa: F401  (torch + ignite, as the launcher has)

def worker(local_rank, out):
    import distkit.train.training  # noqa: F401  (what a kit worker imports)
    idist.barrier()
    if idist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"ready_unix_s": time.time()}, f)

if __name__ == "__main__":
    method, out = sys.argv[1], sys.argv[2]
    from distkit.host.facts import free_port
    with idist.Parallel(backend="gloo", nproc_per_node=2, master_port=free_port(), start_method=method) as p:
        p.run(worker, out)
    ready = json.load(open(out))["ready_unix_s"] - T0
    print(f"{method}: workers ready {ready:.2f} s after the parent started; command {time.time() - T0:.2f} s")
