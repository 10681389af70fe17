#!/usr/bin/python3
"""The PyTorch twin of examples/gpt: nanoGPT's character-level Shakespeare run, for bench/gpt_compare.py.

Trains what nanoGPT (karpathy/nanoGPT, MIT) trains with config/train_shakespeare_char.py in its
CPU configuration (`--device=cpu --compile=False --eval_iters=20 --block_size=64 --batch_size=12
--n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0`),
written here from its description, not copied, for Debian's python3-torch 1.13:

  model      token embedding wte [V, C] + learned position embedding wpe [block, C], dropout,
             n_layer pre-LayerNorm blocks  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x)),
             final LayerNorm ln_f, logits = x @ wte.T (the head is tied to wte).
             attn: one fused c_attn Linear C -> 3C (q, k, v in that order), n_head heads,
             att = softmax(mask(q @ k^T / sqrt(C / n_head))) with the causal mask as -inf,
             dropout, y = att @ v, heads concatenated, c_proj Linear C -> C, dropout.
             (No scaled_dot_product_attention in 1.13: matmul, mask, softmax, as nanoGPT's
             fallback.) mlp: c_fc C -> 4C, GELU (exact, erf), c_proj 4C -> C, dropout.
             LayerNorm eps 1e-5, with a bias only under --bias; Linears have biases only under
             --bias. Vocabulary V = the sorted distinct characters of --input.
  init       torch.manual_seed(seed), then the parameters are created uninitialised and filled
             in this order, each once: wte ~ N(0, 0.02), wpe ~ N(0, 0.02), then per block
             ln_1.weight = 1, [ln_1.bias = 0], c_attn.weight ~ N(0, 0.02), [c_attn.bias = 0],
             attn c_proj.weight (attn_proj here) ~ N(0, 0.02 / sqrt(2 n_layer)), [bias = 0],
             ln_2.weight = 1, [ln_2.bias = 0], c_fc.weight ~ N(0, 0.02), [bias = 0], mlp
             c_proj.weight (mlp_proj here) ~
             N(0, 0.02 / sqrt(2 n_layer)), [bias = 0]; then ln_f.weight = 1, [ln_f.bias = 0].
             (Weights are [out, in] as nn.Linear's. Under DDP rank 0's weights are broadcast.)
  data       the text encoded by vocabulary index; the first int(0.9 n) characters train, the
             rest validate. A batch is `batch_size` windows, x = d[i:i+block], y = d[i+1:i+1+block]
             with i = torch.randint(len(d) - block, (batch_size,), generator=g), g a
             torch.Generator seeded with seed + rank, one draw per micro-batch; evaluation draws
             from the same generator (train split first, then val, eval_iters each).
  training   AdamW(lr, betas=(beta1, beta2), eps 1e-8), weight decay on the parameters of 2 or
             more dimensions (wte, wpe, Linear weights), none on the others; learning rate per
             iteration it: lr * (it + 1) / (warmup_iters + 1) while it < warmup_iters, cosine from
             lr to min_lr between warmup_iters and lr_decay_iters, min_lr after;
             gradient_accumulation_steps micro-batches per iteration, each loss divided by it
             (DDP's all-reduce only on the last); gradient norm clipped to grad_clip (0: off).
             Cross entropy over all tokens (mean). Iterations 0 .. max_iters - 1.
  evaluation at iteration 0, every eval_interval and at max_iters (before that iteration's
             step): eval mode, no_grad, the mean loss of eval_iters random batches of the train
             split and of the val split, each rank drawing its own, the two means averaged over
             the ranks with one all_reduce. At the end, the loss over the whole validation split:
             its (len - 1) // block non-overlapping windows (window w starts at w * block, targets
             shifted by one), window w on rank w % world, token-weighted mean, all-reduced.

Under torchrun (RANK in the environment) it uses DistributedDataParallel, gloo on --device cpu,
nccl on --device cuda (device cuda:LOCAL_RANK); without, one process without a group:
    /usr/bin/python3 bench/gpt_twin.py --input ../shared/data/tinyshakespeare.txt --threads 2
    /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node 2 --redirects 1 \
        --tee 1 bench/gpt_twin.py --input ../shared/data/tinyshakespeare.txt --batch_size 6 \
        --threads 1
(Debian's torchrun 1.13 crashes on Python 3.11 without `--redirects 1 --tee 1`.)

Rank 0 prints to stdout, flushed at once (under `--tee 1` torchrun prefixes `[default0]:`):
    READY world=W threads=T                                 data, group and model ready
    step N: train loss X.XXXX, val loss Y.YYYY              each evaluation, N the iteration
    val loss over the whole validation split: Z.ZZZZ        at the end
    done: I iterations                                      last
"""
import argparse
import math
import os
import sys
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

WHOLE_SPLIT_BATCH = 64  # windows per forward when evaluating the whole validation split


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--input", required=True, help="the training text (e.g. tinyshakespeare.txt)")
    p.add_argument("--max_iters", type=int, default=2000)
    p.add_argument("--eval_interval", type=int, default=250)
    p.add_argument("--eval_iters", type=int, default=20)
    p.add_argument("--batch_size", type=int, default=12, help="windows per micro-batch per process")
    p.add_argument("--block_size", type=int, default=64)
    p.add_argument("--n_layer", type=int, default=4)
    p.add_argument("--n_head", type=int, default=4)
    p.add_argument("--n_embd", type=int, default=128)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--bias", action="store_true", help="biases in Linears and LayerNorms")
    p.add_argument("--learning_rate", type=float, default=1e-3)
    p.add_argument("--min_lr", type=float, default=1e-4)
    p.add_argument("--warmup_iters", type=int, default=100)
    p.add_argument("--lr_decay_iters", type=int, default=2000)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--weight_decay", type=float, default=0.1)
    p.add_argument("--grad_clip", type=float, default=1.0, help="0 turns clipping off")
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="bfloat16: autocast")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads (default: cores / local processes)")
    args = p.parse_args()
    for name in ("max_iters", "eval_iters", "eval_interval", "batch_size", "block_size",
                 "n_layer", "n_head", "n_embd", "gradient_accumulation_steps"):
        if getattr(args, name) < (0 if name == "max_iters" else 1):
            p.error("--%s is out of range" % name)
    if args.n_embd % args.n_head:
        p.error("--n_embd must be a multiple of --n_head")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be 1 or more")
    return args


# ---------------------------------------------------------------------------------------------
# The model


class LayerNorm(nn.Module):
    def __init__(self, n, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n))
        self.bias = nn.Parameter(torch.empty(n)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class Linear(nn.Module):
    def __init__(self, n_in, n_out, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in))
        self.bias = nn.Parameter(torch.empty(n_out)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.n_head, self.dropout = a.n_head, a.dropout
        self.ln_1 = LayerNorm(a.n_embd, a.bias)
        self.c_attn = Linear(a.n_embd, 3 * a.n_embd, a.bias)
        self.attn_proj = Linear(a.n_embd, a.n_embd, a.bias)
        self.ln_2 = LayerNorm(a.n_embd, a.bias)
        self.c_fc = Linear(a.n_embd, 4 * a.n_embd, a.bias)
        self.mlp_proj = Linear(4 * a.n_embd, a.n_embd, a.bias)
        # A plain attribute, not a buffer: DDP would broadcast a buffer, and gloo has no bool.
        self.mask = torch.tril(torch.ones(a.block_size, a.block_size, dtype=torch.bool))

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # [B, T, C] -> [B, heads, T, C / heads]
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if self.mask.device != x.device:
            self.mask = self.mask.to(x.device)
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        att = F.dropout(F.softmax(att, dim=-1), self.dropout, self.training)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return F.dropout(self.attn_proj(y), self.dropout, self.training)

    def mlp(self, x):
        x = self.mlp_proj(F.gelu(self.c_fc(x)))
        return F.dropout(x, self.dropout, self.training)

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, a, vocab):
        super().__init__()
        self.dropout = a.dropout
        self.wte = nn.Parameter(torch.empty(vocab, a.n_embd))
        self.wpe = nn.Parameter(torch.empty(a.block_size, a.n_embd))
        self.blocks = nn.ModuleList(Block(a) for _ in range(a.n_layer))
        self.ln_f = LayerNorm(a.n_embd, a.bias)
        self.initialise(a.n_layer)

    @torch.no_grad()
    def initialise(self, n_layer):
        """Each parameter filled once, in the order of the module docstring."""
        residual_std = 0.02 / math.sqrt(2 * n_layer)

        def linear(l, std):
            l.weight.normal_(0.0, std)
            if l.bias is not None:
                l.bias.zero_()

        def norm(l):
            l.weight.fill_(1.0)
            if l.bias is not None:
                l.bias.zero_()

        self.wte.normal_(0.0, 0.02)
        self.wpe.normal_(0.0, 0.02)
        for b in self.blocks:
            norm(b.ln_1)
            linear(b.c_attn, 0.02)
            linear(b.attn_proj, residual_std)
            norm(b.ln_2)
            linear(b.c_fc, 0.02)
            linear(b.mlp_proj, residual_std)
        norm(self.ln_f)

    def forward(self, idx, targets=None, reduction="mean"):
        T = idx.size(1)
        x = F.dropout(F.embedding(idx, self.wte) + self.wpe[:T], self.dropout, self.training)
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.t()
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1),
                               reduction=reduction)


# ---------------------------------------------------------------------------------------------
# Data, learning rate, evaluation


def load_text(path):
    try:
        with open(path, "r", encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise SystemExit("cannot read --input %s (%s)" % (path, e))
    chars = sorted(set(text))
    if len(text) < 2:
        raise SystemExit("--input %s is too short" % path)
    index = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([index[c] for c in text], dtype=torch.long)
    n = int(0.9 * len(data))
    return data[:n], data[n:], len(chars)


def get_batch(d, a, generator, device):
    i = torch.randint(len(d) - a.block_size, (a.batch_size,), generator=generator)
    at = i.unsqueeze(1) + torch.arange(a.block_size)
    return d[at].to(device), d[at + 1].to(device)


def learning_rate(it, a):
    if it < a.warmup_iters:
        return a.learning_rate * (it + 1) / (a.warmup_iters + 1)
    if it > a.lr_decay_iters:
        return a.min_lr
    ratio = (it - a.warmup_iters) / max(1, a.lr_decay_iters - a.warmup_iters)
    return a.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (a.learning_rate - a.min_lr)


@torch.no_grad()
def estimate_loss(model, train, val, a, generator, device, ctx, distributed, world):
    model.eval()
    means = torch.zeros(2, dtype=torch.float64)
    for s, d in enumerate((train, val)):
        total = 0.0
        for _ in range(a.eval_iters):
            x, y = get_batch(d, a, generator, device)
            with ctx:
                total += model(x, y).item()
        means[s] = total / a.eval_iters
    model.train()
    if distributed:
        means = means.to(device)
        dist.all_reduce(means)
        means = means.cpu() / world
    return means[0].item(), means[1].item()


@torch.no_grad()
def whole_split_loss(model, val, a, device, ctx, distributed, rank, world):
    model.eval()
    windows = (len(val) - 1) // a.block_size
    mine = torch.arange(rank, windows, world)
    sums = torch.zeros(2, dtype=torch.float64)  # loss summed over tokens, tokens
    for first in range(0, len(mine), WHOLE_SPLIT_BATCH):
        starts = mine[first:first + WHOLE_SPLIT_BATCH] * a.block_size
        at = starts.unsqueeze(1) + torch.arange(a.block_size)
        with ctx:
            loss = model(val[at].to(device), val[at + 1].to(device), reduction="sum")
        sums[0] += loss.double().item()
        sums[1] += at.numel()
    model.train()
    if distributed:
        sums = sums.to(device)
        dist.all_reduce(sums)
        sums = sums.cpu()
    return (sums[0] / sums[1]).item()


def say(rank, text):
    if rank == 0:
        print(text, flush=True)


# ---------------------------------------------------------------------------------------------
# Main


def main():
    a = parse_args()
    distributed = "RANK" in os.environ
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if distributed else 1
    threads = a.threads or max(1, len(os.sched_getaffinity(0)) // local_world)
    torch.set_num_threads(threads)

    if a.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device is available")
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if distributed:
        dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1

    train, val, vocab = load_text(a.input)
    if min(len(train), len(val)) <= a.block_size:
        raise SystemExit("--input is too short for --block_size %d" % a.block_size)

    torch.manual_seed(a.seed)
    model = GPT(a, vocab).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": a.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=a.learning_rate, betas=(a.beta1, a.beta2))
    net = DistributedDataParallel(model, device_ids=[device.index] if a.device == "cuda" else None) \
        if distributed else model  # broadcasts rank 0's weights
    generator = torch.Generator()
    generator.manual_seed(a.seed + rank)
    amp = torch.bfloat16 if a.dtype == "bfloat16" else None
    ctx = torch.autocast(device_type=a.device, dtype=amp) if amp else nullcontext()

    say(rank, "READY world=%d threads=%d" % (world, torch.get_num_threads()))
    it = 0
    while True:
        if it % a.eval_interval == 0 or it == a.max_iters:
            train_loss, val_loss = estimate_loss(model, train, val, a, generator, device, ctx,
                                                 distributed, world)
            say(rank, "step %d: train loss %.4f, val loss %.4f" % (it, train_loss, val_loss))
        if it >= a.max_iters:
            break
        lr = learning_rate(it, a)
        for group in optimizer.param_groups:
            group["lr"] = lr
        for micro in range(a.gradient_accumulation_steps):
            last = micro == a.gradient_accumulation_steps - 1
            x, y = get_batch(train, a, generator, device)
            sync = net.no_sync() if distributed and not last else nullcontext()
            with sync:
                with ctx:
                    loss = net(x, y) / a.gradient_accumulation_steps
                loss.backward()
        if a.grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        it += 1

    whole = whole_split_loss(model, val, a, device, ctx, distributed, rank, world)
    say(rank, "val loss over the whole validation split: %.4f" % whole)
    say(rank, "done: %d iterations" % it)
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
