"""benchmarks/tiny_steps_plain.py: the tiny steady loop with no ignite and no kit: torch.multiprocessing workers (fork)
set up the process group themselves, or the same worker joined under torchrun.

    python benchmarks/tiny_steps_plain.py 8 out.json fork          # rank 0 hosts the store
    V_PARENT_STORE=1 python benchmarks/tiny_steps_plain.py 8 out.json fork  # the parent does
    V_SETSID=1 python benchmarks/tiny_steps_plain.py 8 out.json fork        # own sessions
    python -m torch.distributed.run --nproc-per-node 2 benchmarks/tiny_steps_plain.py 8 out.json

The loop is benchmarks/tiny_steps_launchers.py's, written without ignite or the kit on
purpose. Results: benchmarks/results/tiny-steps-sessions-quiet.txt."""
import os, sys, time, json
import torch, torch.distributed as dist

def worker(local_rank, seconds, out, port):
    if port:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(local_rank), WORLD_SIZE="2", LOCAL_RANK=str(local_rank))
    torch.set_num_threads(1)
    if os.environ.get("V_SETSID"): os.setsid()
    if os.environ.get("V_PARENT_STORE") and port:
        store = dist.TCPStore("127.0.0.1", port + 1, 2, is_master=False)
        dist.init_process_group("gloo", store=store, rank=local_rank, world_size=2)
    else:
        dist.init_process_group("gloo")
    from torch.nn.parallel import DistributedDataParallel as DDP
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    from distkit.builtin.models import MLP
    torch.manual_seed(0)
    model = DDP(MLP())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    def step():
        opt.zero_grad(); torch.nn.functional.cross_entropy(model(x), y).backward(); opt.step()
    for _ in range(20): step()
    dist.barrier()
    n, start = 0, time.perf_counter()
    flag = torch.zeros(1)
    while True:
        step(); n += 1
        if n % 50 == 0:
            flag.fill_(float(time.perf_counter() - start > seconds)); dist.all_reduce(flag)
            if flag.item() > 0: break
    rate = n / (time.perf_counter() - start)
    if dist.get_rank() == 0:
        json.dump({"steps_per_s": rate}, open(out, "w"))
    dist.destroy_process_group()

if __name__ == "__main__":
    seconds, out = float(sys.argv[1]), sys.argv[2]
    if "WORLD_SIZE" in os.environ:
        worker(int(os.environ["LOCAL_RANK"]), seconds, out, None)
    else:
        import socket, torch.multiprocessing as mp
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        os.environ["OMP_NUM_THREADS"] = "1"
        if os.environ.get("V_PARENT_STORE"):
            keep = dist.TCPStore("127.0.0.1", port + 1, 2, is_master=True, wait_for_workers=False)
        mp.start_processes(worker, args=(seconds, out, port), nprocs=2, start_method=sys.argv[3] if len(sys.argv) > 3 else "fork")
