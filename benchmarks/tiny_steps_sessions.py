"""Does the session a worker runs in change tiny-step speed on a shared machine?

torchrun starts every worker in a session of its own (``start_new_session=True``);
``idist.Parallel`` spawn leaves them in the launcher's session. With the kernel's
autogroup scheduling on (``/proc/sys/kernel/sched_autogroup_enabled`` = 1 here), CPU
time is shared out between sessions first. Two gloo workers run tiny DDP steps
(8 samples, 1 thread each) for N seconds, either in the launcher's session or each
calling ``os.setsid()`` first; rounds alternate which goes first.

    python benchmarks/tiny_steps_sessions.py ROUNDS SECONDS

Results: benchmarks/results/tiny-steps-sessions.txt."""
import os, sys, time, statistics
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

def worker(rank, own_session, port, seconds, q):
    if own_session:
        os.setsid()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    for _ in range(20):
        opt.zero_grad(); torch.nn.functional.cross_entropy(model(x), y).backward(); opt.step()
    dist.barrier()
    n, start = 0, time.perf_counter()
    while True:
        opt.zero_grad(); torch.nn.functional.cross_entropy(model(x), y).backward(); opt.step()
        n += 1
        if n % 50 == 0:
            done = torch.tensor([time.perf_counter() - start > seconds], dtype=torch.float32)
            dist.all_reduce(done)
            if done.item() > 0:
                break
    if rank == 0:
        q.put(n / (time.perf_counter() - start))
    dist.destroy_process_group()

if __name__ == "__main__":
    import socket
    ctx = mp.get_context("fork")
    rates = {False: [], True: []}
    for r in range(int(sys.argv[1])):
        for own in ((False, True) if r % 2 == 0 else (True, False)):
            s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
            q = ctx.SimpleQueue()
            procs = [ctx.Process(target=worker, args=(i, own, port, float(sys.argv[2]), q)) for i in range(2)]
            for p in procs: p.start()
            for p in procs: p.join()
            rates[own].append(q.get())
        print(f"round {r}: same session {rates[False][-1]:.0f} steps/s, own sessions {rates[True][-1]:.0f} steps/s", flush=True)
    ratio = statistics.median(a / b for a, b in zip(rates[False], rates[True]))
    print(f"median same-session / own-session steps/s: {ratio:.3f}; load {os.getloadavg()}")
