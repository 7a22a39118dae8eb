"""``training(local_rank, config, task)`` and what it is made of: the step, strategies
(ddp / fsdp), schedules, stopping and signals, agreement across ranks."""
