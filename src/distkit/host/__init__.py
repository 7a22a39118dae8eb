"""Facts about this machine and this launch: ports, threads, interfaces, processes, and the
one reader of the torchrun / SLURM layout. No torch at import; imports nothing else of the kit
but ``errors``."""
