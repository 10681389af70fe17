#!/usr/bin/python3
"""The Python reference for the training-throughput benchmarks: PyTorch DDP (or a plain loop).

Trains a small CNN or MLP on synthetic MNIST-shaped data and reports throughput, to be compared
with `bench_training` (Accelerant) by bench/compare_training.py.

Distributed, with Debian's torch 1.13 (its torchrun crashes without `--redirects 1 --tee 1`):
    /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node P \
        --redirects 1 --tee 1 bench/ddp_train.py --model cnn --batch 64 --threads 1
Single process (no RANK in the environment, or --plain): a plain loop without a process group:
    bench/ddp_train.py --plain --model mlp --batch 64 --threads 2

--threads T calls torch.set_num_threads(T) before anything else; the driver also sets
OMP_NUM_THREADS=T and OPENBLAS_NUM_THREADS=T in the environment of the run.

Rank 0 prints exactly one line:
    RESULT samples_per_sec=<B*world*S/elapsed> step_ms_median=<median step ms> world=<N>
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

NUM_BATCHES = 64  # distinct synthetic batches, cycled through


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("cnn", "mlp"), default="cnn")
    p.add_argument("--batch", type=int, default=64, help="samples per step and per process")
    p.add_argument("--steps", type=int, default=60, help="timed steps")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps before timing")
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads(T); 0 leaves torch's default")
    p.add_argument("--plain", action="store_true",
                   help="single process, no process group, even under torchrun")
    args = p.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.batch < 1:
        p.error("need --steps >= 1, --warmup >= 0 and --batch >= 1")
    return args


def build_model(name):
    torch.manual_seed(0)  # same initial weights on every rank and in every run
    if name == "cnn":
        return nn.Sequential(
            # examples/fashion_mnist's Net, layer for layer
            nn.Conv2d(1, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(
        nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
        nn.Linear(512, 10))


def make_batches(batch, rank):
    """NUM_BATCHES (input, label) pairs, generated once, different on each rank."""
    gen = torch.Generator().manual_seed(1234 + rank)
    return [(torch.randn(batch, 1, 28, 28, generator=gen),
             torch.randint(0, 10, (batch,), generator=gen)) for _ in range(NUM_BATCHES)]


def main():
    args = parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    # Under torchrun (RANK set) join a gloo group unless --plain asks for the single-process loop.
    distributed = "RANK" in os.environ and not args.plain
    if args.plain and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise SystemExit("--plain is a single-process run; do not start it with nproc_per_node > 1")
    if distributed:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1

    model = build_model(args.model)
    if distributed:
        model = DistributedDataParallel(model)  # default bucket size
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batches = make_batches(args.batch, rank)

    def train_step(i):
        inputs, labels = batches[i % NUM_BATCHES]
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()

    for i in range(args.warmup):
        train_step(i)
    if distributed:
        dist.barrier()  # all ranks start the timed steps together

    step_seconds = []
    start = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        t0 = time.perf_counter()
        train_step(i)
        step_seconds.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - start

    if rank == 0:
        samples_per_sec = args.batch * world * args.steps / elapsed
        print("RESULT samples_per_sec=%.2f step_ms_median=%.3f world=%d"
              % (samples_per_sec, statistics.median(step_seconds) * 1000.0, world), flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
