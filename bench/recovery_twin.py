#!/usr/bin/python3
"""The PyTorch twin of bench_recovery (bench/recovery.cpp), run under torchrun --max_restarts:
the same MLP, batch, optimizer and checkpoint interval, with PyTorch's usual recovery (torchrun
restarts every worker, each loads the last checkpoint and computes the lost steps again).

    python3 -m torch.distributed.run --standalone --nproc_per_node 2 --max_restarts 1 \
        --redirects 1 --tee 1 bench/recovery_twin.py --steps 40 --kill_at 17 \
        --checkpoint_every 10 --project DIR

In the first attempt rank 1 SIGKILLs itself between the forward and the backward of the step after
--kill_at steps, printing "KILL <CLOCK_MONOTONIC seconds>"; rank 0 prints "STEP <n> <seconds>"
after each completed step.
"""
import argparse
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--kill_at", type=int, default=17)
    p.add_argument("--checkpoint_every", type=int, default=10)
    p.add_argument("--project", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512),
                          nn.ReLU(), nn.Linear(512, 10))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    batches = 16 * world
    x = torch.randn(64 * batches, 1, 28, 28)
    y = torch.randint(0, 10, (64 * batches,))
    path = os.path.join(args.project, "checkpoint.pt")
    step = 0
    if os.path.exists(path):
        state = torch.load(path)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
    first_attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0
    while step < args.steps:
        b = (step * world + rank) % batches
        loss = F.cross_entropy(ddp(x[64 * b:64 * (b + 1)]), y[64 * b:64 * (b + 1)])
        if first_attempt and rank == 1 and step == args.kill_at:
            print("KILL %.6f" % time.monotonic(), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if rank == 0:
            print("STEP %d %.6f" % (step, time.monotonic()), flush=True)
        if step % args.checkpoint_every == 0:
            if rank == 0:
                os.makedirs(args.project, exist_ok=True)
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                            "step": step}, path + ".partial")
                os.replace(path + ".partial", path)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
