#!/usr/bin/python3
"""The PyTorch twin of examples/fashion_mnist, for bench/time_to_accuracy.py.

Trains what `build/bin/fashion_mnist` trains, with plain PyTorch DistributedDataParallel (gloo)
under torchrun: the same CNN (conv 1->16 k5, max-pool 2, conv 16->32 k5, max-pool 2, fc 512->128,
fc 128->10, ReLUs), weights seeded with torch.manual_seed(seed) just before the model is built
(rank 0's are broadcast), Adam (lr 2e-3, PyTorch's default betas/eps, no weight decay), cross
entropy, batch 64 per process, on Debian's Fashion-MNIST (dataset-fashion-mnist,
/usr/share/datasets/fashion-mnist/*-idx*-ubyte.gz) normalised like the example
((x/255 - 0.2860) / 0.3530). Each rank trains on its own part of every epoch, chosen exactly as
Accelerant's loader does (src/train/data_sharding.cpp): one permutation per epoch from a generator
seeded with seed + epoch, global step s gives rank r the positions (s*W + r)*B .. +B of it, and
the last step is filled up from the head of the order (even_batches), so that both ranks run the
same number of full batches. After each epoch the test set (batch 500 per process, not shuffled,
split the same way) is evaluated on both ranks and the counts are all-reduced.

Run with Debian's torch 1.13 (its torchrun crashes on Python 3.11 without `--redirects 1 --tee 1`):
    /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node 2 \
        --redirects 1 --tee 1 bench/fashion_mnist_twin.py --epochs 3
Without torchrun (no RANK in the environment) it trains as one process without a group.

One intra-op thread per process by default (--threads), as the example picks on a 2-core machine
with 2 processes (cores / local processes; its "Training on ..." line says so).

Rank 0 prints to stdout, flushed at once (under `--tee 1` torchrun prefixes `[default0]:`):
    READY world=W threads=T steps_per_epoch=S     data loaded, group joined, model broadcast:
                                                  the first training step comes next
    TRAINED n                                     epoch n's last step is done; evaluation next
    EPOCH n ACCURACY a.aa                         test accuracy (percent) after epoch n
"""
import argparse
import gzip
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

TEST_BATCH = 500  # the example's test loader


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2, help="passes over the training set")
    p.add_argument("--batch_size", type=int, default=64, help="samples per step on each process")
    p.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=42, help="seed of the weights and the shuffling")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per process")
    p.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist",
                   help="directory of the *-idx*-ubyte.gz files")
    args = p.parse_args()
    if args.epochs < 1 or args.batch_size < 1 or args.threads < 1:
        p.error("need --epochs, --batch_size and --threads of 1 or more")
    return args


# ---------------------------------------------------------------------------------------------
# Data: the example's idx_reader.cpp


def read_gzip(path):
    try:
        with gzip.open(path, "rb") as f:
            return bytearray(f.read())  # writable, so that torch.frombuffer does not warn
    except OSError as e:
        raise SystemExit("cannot read %s (%s). Fix: install Debian's dataset-fashion-mnist or "
                         "pass --data_dir" % (path, e))


def big_endian(b, at):
    return int.from_bytes(b[at:at + 4], "big")


def load_split(directory, name):
    """(images [N, 1, 28, 28] float normalised, labels [N] int64) of "train" or "t10k"."""
    images_path = os.path.join(directory, name + "-images-idx3-ubyte.gz")
    labels_path = os.path.join(directory, name + "-labels-idx1-ubyte.gz")
    images, labels = read_gzip(images_path), read_gzip(labels_path)
    if len(images) < 16 or big_endian(images, 0) != 2051:
        raise SystemExit(images_path + " is not an IDX image file (magic 2051 expected)")
    if len(labels) < 8 or big_endian(labels, 0) != 2049:
        raise SystemExit(labels_path + " is not an IDX label file (magic 2049 expected)")
    count, rows, cols = big_endian(images, 4), big_endian(images, 8), big_endian(images, 12)
    if big_endian(labels, 4) != count or len(images) != 16 + count * rows * cols or \
            len(labels) != 8 + count:
        raise SystemExit("the sizes in %s and %s disagree" % (images_path, labels_path))
    x = torch.frombuffer(images, dtype=torch.uint8, offset=16).view(count, 1, rows, cols)
    # The same float32 operations in the same order as the example.
    x = x.to(torch.float).div_(255).sub_(0.2860).div_(0.3530)
    y = torch.frombuffer(labels, dtype=torch.uint8, offset=8).to(torch.long)
    return x, y


# ---------------------------------------------------------------------------------------------
# Sharding: accelerant::shard_epoch with shuffle as asked, even_batches on, drop_last off


def shard_epoch(n, epoch, rank, world, batch, shuffle, seed):
    """This rank's batches of one epoch: a list of (indices, real) with `real` false at the
    even_batches repeats (which train, but evaluation does not count)."""
    if shuffle:
        generator = torch.Generator()
        generator.manual_seed(seed + epoch)
        order = torch.randperm(n, generator=generator)
    else:
        order = torch.arange(n)
    per_step = batch * world
    steps = (n + per_step - 1) // per_step
    batches = []
    for s in range(steps):
        positions = torch.arange((s * world + rank) * batch, (s * world + rank + 1) * batch)
        real = positions < n
        # Past the end: repeat from the head of the order.
        batches.append((order[torch.where(real, positions, (positions - n) % n)], real))
    return batches


# ---------------------------------------------------------------------------------------------
# The model: the example's NetImpl, parameters registered (and initialised) in the same order


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5)
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.fc1 = nn.Linear(32 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def say(rank, text):
    if rank == 0:
        print(text, flush=True)


def evaluate(model, images, labels, rank, world, distributed):
    """Percentage of the test set classified correctly, counted over both ranks' shares."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.long)  # correct, seen
    with torch.no_grad():
        for indices, real in shard_epoch(images.size(0), 0, rank, world, TEST_BATCH, False, 0):
            hits = (model(images[indices]).argmax(1) == labels[indices])[real]
            step = torch.tensor([int(hits.sum()), hits.numel()], dtype=torch.long)
            if distributed:  # one collective per test step, as gather_for_metrics has
                dist.all_reduce(step)
            counts += step
    model.train()
    return 100.0 * counts[0].item() / counts[1].item()


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)

    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1

    train_x, train_y = load_split(args.data_dir, "train")
    test_x, test_y = load_split(args.data_dir, "t10k")

    torch.manual_seed(args.seed)  # as the Accelerator seeds before the example builds its Net
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    net = DistributedDataParallel(model) if distributed else model  # broadcasts rank 0's weights

    steps = len(shard_epoch(train_x.size(0), 0, rank, world, args.batch_size, False, 0))
    say(rank, "READY world=%d threads=%d steps_per_epoch=%d"
        % (world, torch.get_num_threads(), steps))
    for epoch in range(args.epochs):
        for indices, _ in shard_epoch(train_x.size(0), epoch, rank, world, args.batch_size, True,
                                      args.seed):
            loss = F.cross_entropy(net(train_x[indices]), train_y[indices])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            loss.item()  # the example reads every step's loss for its progress bar
        say(rank, "TRAINED %d" % (epoch + 1))
        accuracy = evaluate(model, test_x, test_y, rank, world, distributed)
        say(rank, "EPOCH %d ACCURACY %.2f" % (epoch + 1, accuracy))

    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
