#!/usr/bin/python3
"""Training throughput of Accelerant, measured side by side (interleaved) in one run.

Runs pairs of commands alternately, round by round, and prints a Markdown section on stdout with
the median samples/s of each side over the rounds, their ratio and the goal:

  a. `bench_training --processes 2 --threads 1` vs PyTorch DDP under torchrun (bench/ddp_train.py,
     2 processes, OMP_NUM_THREADS=1), CNN and MLP. Goal: >= 1.3x samples/s.
  b. Scaling: `bench_training --model cnn --processes 2 --threads 1` vs the machine's own limit,
     two independent single-process runs started at the same time (their samples/s summed).
     Goal: >= 0.95x of the sum.
  c. Overhead: `bench_training --processes 1 --threads 1 --paired-overhead`, which trains a plain
     LibTorch loop and the Accelerator in one process in alternating blocks (RESULT and PLAIN
     lines), CNN and MLP. Overhead % = (plain/accelerator - 1) * 100. Goal: <= 3 %.
  d. CPU defaults: `bench_training --model cnn --processes 2` (the library picks threads and
     allocator) vs the same with each default turned off (--no-cpu-defaults, --no-thread-defaults,
     --no-malloc-defaults). Reported as on/off, no goal.

Every command must print one line `RESULT samples_per_sec=X step_ms_median=Y world=N` (torchrun's
`[default0]:` prefix is fine). Batch 64 per process. Steps/warmup: 60/10 for cnn, 200/20 for mlp,
multiplied by the environment variable BENCH_STEPS_SCALE (default 1) for quick smoke runs.
The current environment is passed through, plus OMP_NUM_THREADS/OPENBLAS_NUM_THREADS=T where a
thread count T is given (and without any *_NUM_THREADS in d, so that the library really picks).
Progress goes to stderr.

Usage: compare_training.py BUILD_DIR [ROUNDS]    (ROUNDS defaults to 3)
"""
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = "/usr/bin/python3"  # Debian's python3 with python3-torch 1.13
BATCH = 64
TIMEOUT_S = 600
DEFAULT_STEPS = {"cnn": (60, 10), "mlp": (200, 20)}  # model -> (timed steps, warmup steps)
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
RESULT_RE = re.compile(r"RESULT samples_per_sec=([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)")


# ---------------------------------------------------------------------------------------------
# Running commands


def parse_result(cmd, returncode, stdout, stderr):
    """samples/s from the single RESULT line of a finished command; SystemExit on any failure."""
    found = RESULT_RE.findall(stdout)
    if returncode == 0 and len(found) == 1:
        return float(found[0])
    why = "exit code %d" % returncode if returncode != 0 else \
        "%d RESULT lines instead of exactly 1" % len(found)
    tail = (stdout + stderr)[-4000:]
    raise SystemExit("benchmark command failed (%s):\n  %s\n--- output tail ---\n%s"
                     % (why, shlex.join(cmd), tail))


def run_result(cmd, env, pattern=None):
    """Runs cmd (timeout TIMEOUT_S) and returns the samples/s of its RESULT line, and with
    `pattern` also the first group of that regex in its output."""
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        text = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                       for x in (e.stdout, e.stderr))
        raise SystemExit("benchmark command timed out after %d s:\n  %s\n--- output tail ---\n%s"
                         % (TIMEOUT_S, shlex.join(cmd), text[-4000:]))
    value = parse_result(cmd, out.returncode, out.stdout, out.stderr)
    if pattern is None:
        return value
    other = re.search(pattern, out.stdout)
    if other is None:
        raise SystemExit("no match for %r in the output of:\n  %s" % (pattern, shlex.join(cmd)))
    return value, float(other.group(1))


def run_concurrently(cmds, env):
    """Starts all cmds at once and returns the sum of their samples/s."""
    # Output goes to temporary files, so that no process can block on a full pipe.
    procs = []
    for cmd in cmds:
        out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        procs.append((cmd, subprocess.Popen(cmd, env=env, stdout=out, stderr=err), out, err))
    deadline = time.monotonic() + TIMEOUT_S
    try:
        for cmd, proc, _, _ in procs:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for _, proc, _, _ in procs:
            proc.kill()
            proc.wait()
        raise SystemExit("concurrent benchmark commands timed out after %d s:\n  %s"
                         % (TIMEOUT_S, "\n  ".join(shlex.join(c) for c, _, _, _ in procs)))
    total = 0.0
    for cmd, proc, out, err in procs:
        out.seek(0)
        err.seek(0)
        total += parse_result(cmd, proc.returncode, out.read(), err.read())
        out.close()
        err.close()
    return total


class Side:
    """One side of a comparison: a command, or several started at once (samples/s summed)."""

    def __init__(self, cmds, threads, extra_env=None):
        self.cmds = cmds
        self.threads = threads  # None: no *_NUM_THREADS at all, the program picks
        self.extra_env = extra_env or {}

    def env(self):
        env = dict(os.environ)
        for var in THREAD_VARS:
            env.pop(var, None)
        if self.threads is not None:
            env["OMP_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = str(self.threads)
        env.update(self.extra_env)
        return env

    def measure(self):
        if len(self.cmds) == 1:
            return run_result(self.cmds[0], self.env())
        return run_concurrently(self.cmds, self.env())

    def markdown(self):
        prefix = "" if self.threads is None else \
            "OMP_NUM_THREADS=%d OPENBLAS_NUM_THREADS=%d " % (self.threads, self.threads)
        prefix += "".join("%s=%s " % item for item in sorted(self.extra_env.items()))
        shown = ["`%s%s`" % (prefix, shlex.join(c)) for c in self.cmds]
        if len(shown) == 1:
            return shown[0]
        return "started at the same time: " + " and ".join(shown)


class Paired:
    """One command that measures both sides in one process (`bench_training --paired-overhead`
    prints RESULT for the Accelerator and PLAIN for the plain loop). Each round runs it once; the
    two sides of the comparison read its two numbers."""

    PLAIN_RE = r"PLAIN samples_per_sec=([0-9.eE+-]+)"

    def __init__(self, cmd, threads, extra_env=None):
        self.side = Side([cmd], threads, extra_env)
        self.unread = {}

    def value(self, which):
        if which not in self.unread:
            accelerator, plain = run_result(self.side.cmds[0], self.side.env(), self.PLAIN_RE)
            self.unread = {"RESULT": accelerator, "PLAIN": plain}
        return self.unread.pop(which)


class PairedSide:
    """The side of a Paired run that reads the RESULT or the PLAIN line."""

    def __init__(self, paired, which):
        self.paired, self.which = paired, which

    def measure(self):
        return self.paired.value(self.which)

    def markdown(self):
        return "%s (its %s line)" % (self.paired.side.markdown(), self.which)


# ---------------------------------------------------------------------------------------------
# The comparisons


# Marks rows that explain another row's result (what a difference comes from); no goal applies.
REFERENCE = " (reference)"


def steps_for(model):
    """(steps, warmup) for a model, scaled by BENCH_STEPS_SCALE."""
    scale = float(os.environ.get("BENCH_STEPS_SCALE", "1"))
    steps, warmup = DEFAULT_STEPS[model]
    return max(1, round(steps * scale)), max(1, round(warmup * scale))


def ours(build, model, processes, threads=None, extra=()):
    """A bench_training command line."""
    steps, warmup = steps_for(model)
    cmd = [os.path.join(build, "bin", "bench_training"), "--model", model, "--batch", str(BATCH),
           "--steps", str(steps), "--warmup", str(warmup)]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    return cmd + ["--processes", str(processes)] + list(extra)


def torchrun_ddp(model, processes, threads):
    """The PyTorch DDP reference under Debian's torchrun."""
    steps, warmup = steps_for(model)
    return [PYTHON, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node", str(processes), "--redirects", "1", "--tee", "1",
            os.path.relpath(os.path.join(HERE, "ddp_train.py")), "--model", model, "--batch", str(BATCH),
            "--steps", str(steps), "--warmup", str(warmup), "--threads", str(threads)]


class Comparison:
    """A Markdown subsection: rows of (label, side A, side B) and how to judge A against B."""

    def __init__(self, title, note, a_name, b_name, metric_name, metric, fmt, goal, met, rows):
        self.title, self.note = title, note
        self.a_name, self.b_name = a_name, b_name
        self.metric_name, self.metric, self.fmt = metric_name, metric, fmt
        self.goal, self.met = goal, met  # met(value) -> True/False, or None for no goal
        self.rows = rows  # [(label, Side a, Side b)]
        self.samples = {label: ([], []) for label, _, _ in rows}  # label -> (a runs, b runs)


def comparisons(build):
    ratio = lambda a, b: a / b
    times = lambda v: "%.2f×" % v
    return [
        Comparison(
            "a. Accelerant vs torchrun DDP, 2 processes × 1 thread",
            "PyTorch side: bench/ddp_train.py, DistributedDataParallel over gloo, default bucket "
            "size, under Debian's torchrun. The cnn is examples/fashion_mnist's network. The "
            "fused_optimizers row steps the same SGD with Accelerant's fused update (`--fused`). Two "
            "extra rows say where the differences come from: the Accelerant side without its "
            "malloc default (kernels and communication alone), and the MLP without the gradient "
            "all-reduce (`--no-communication`, an upper bound no data-parallel run reaches: "
            "what a faster all-reduce could win).",
            "Accelerant", "torchrun DDP", "Accelerant / DDP", ratio, times,
            "≥ 1.3×", lambda v: v >= 1.3,
            [(m, Side([ours(build, m, 2, 1)], 1), Side([torchrun_ddp(m, 2, 1)], 1))
             for m in ("cnn", "mlp")] +
            # What a user can switch on: the same SGD stepped by the fused update.
            [("mlp, fused_optimizers", Side([ours(build, "mlp", 2, 1, ["--fused"])], 1),
              Side([torchrun_ddp("mlp", 2, 1)], 1))] +
            # Kernel for kernel: without the malloc default, to show how much of the lead is it.
            [("cnn, malloc default off" + REFERENCE, Side([ours(build, "cnn", 2, 1, ["--no-malloc-defaults"])], 1),
              Side([torchrun_ddp("cnn", 2, 1)], 1)),
             ("mlp, no all-reduce" + REFERENCE, Side([ours(build, "mlp", 2, 1, ["--no-communication"])], 1),
              Side([torchrun_ddp("mlp", 2, 1)], 1))]),
        Comparison(
            "b. Scaling: 2 processes vs two independent single-process runs",
            "The reference is the machine's own limit: two single-process runs, no "
            "communication, started at the same time; their samples/s are summed.",
            "Accelerant, 2 processes", "2 × 1 process (sum)", "2 processes / sum", ratio, times,
            "≥ 0.95×", lambda v: v >= 0.95,
            [("cnn", Side([ours(build, "cnn", 2, 1)], 1),
              Side([ours(build, "cnn", 1, 1)] * 2, 1)),
             # The same two processes without the gradient all-reduce: what is left is the cost
             # of running in lockstep; the difference to the row above is communication.
             ("cnn, no all-reduce" + REFERENCE, Side([ours(build, "cnn", 2, 1, ["--no-communication"])], 1),
              Side([ours(build, "cnn", 1, 1)] * 2, 1))]),
        Comparison(
            "c. Overhead of the Accelerator: 1 process × 1 thread, Accelerator vs plain loop",
            "Both sides in one process (`--paired-overhead`): the same model trained by a plain "
            "LibTorch loop and through the Accelerator, in alternating blocks of 5 steps, so that "
            "both see the same machine state; samples/s from each side's median step. The same CPU "
            "settings for both: 1 thread, and the malloc thresholds raised for the whole process "
            "(the defaults themselves are measured in d). One thread, because with two the cnn's "
            "step time on this 2-core VM is bimodal (about 7 or 15 ms for a whole run, on either "
            "side at random), which swamps a 3 % difference. "
            "Overhead = (plain / Accelerator − 1) × 100.",
            "Accelerator", "plain LibTorch", "overhead", lambda a, b: (b / a - 1) * 100,
            lambda v: "%+.1f %%" % v, "≤ 3 %", lambda v: v <= 3.0,
            [(m, PairedSide(pair, "RESULT"), PairedSide(pair, "PLAIN"))
             for m in ("cnn", "mlp")
             for pair in [Paired(ours(build, m, 1, 1, ["--paired-overhead"]), 1)]]),
        Comparison(
            "d. CPU defaults on vs off, 2 processes, threads chosen by the library",
            "No --threads and no *_NUM_THREADS in the environment. Off means LibTorch's own "
            "behaviour: every process sizes its intra-op and OpenBLAS pools to all cores "
            "(`--no-thread-defaults`), glibc's malloc thresholds untouched "
            "(`--no-malloc-defaults`); `--no-cpu-defaults` turns both off.",
            "defaults on", "defaults off", "on / off", ratio, times, "— (on vs off)", None,
            [("%s, %s off" % (m, what), Side([ours(build, m, 2)], None),
              Side([ours(build, m, 2, extra=[flag])], None))
             for m in ("cnn", "mlp")
             for what, flag in (("both", "--no-cpu-defaults"), ("threads", "--no-thread-defaults"),
                                ("malloc", "--no-malloc-defaults"))]),
    ]


# ---------------------------------------------------------------------------------------------
# Main: measure interleaved, then print Markdown


def torch_version():
    out = subprocess.run([PYTHON, "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def print_comparison(comp):
    print("### %s\n" % comp.title)
    print(comp.note + "\n")
    for label, a, b in comp.rows:
        print("- %s, %s: %s" % (label, comp.a_name, a.markdown()))
        print("- %s, %s: %s" % (label, comp.b_name, b.markdown()))
    print()
    print("| model | %s samples/s | %s samples/s | %s | goal | result |"
          % (comp.a_name, comp.b_name, comp.metric_name))
    print("|---|---:|---:|---:|---|---|")
    for label, _, _ in comp.rows:
        a_runs, b_runs = comp.samples[label]
        a, b = statistics.median(a_runs), statistics.median(b_runs)
        value = comp.metric(a, b)
        goal = comp.goal
        if label.endswith(REFERENCE):  # explains a result; the goal is not about it
            goal, result = "—", "—"
        else:
            result = "—" if comp.met is None else ("met" if comp.met(value) else "missed")
        print("| %s | %.1f | %.1f | %s | %s | %s |"
              % (label, a, b, comp.fmt(value), goal, result))
    print()


def main():
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    build = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) == 3 else 3
    binary = os.path.join(build, "bin", "bench_training")
    if not os.access(binary, os.X_OK):
        raise SystemExit("%s not found or not executable: build it first" % binary)

    comps = comparisons(build)
    for r in range(rounds):
        for comp in comps:
            for label, a, b in comp.rows:
                # Alternate which side goes first, so that neither always runs on a "warm" machine.
                order = ((0, a), (1, b)) if r % 2 == 0 else ((1, b), (0, a))
                for index, side in order:
                    value = side.measure()
                    comp.samples[label][index].append(value)
                    print("round %d/%d  %s  %s  %s: %.1f samples/s"
                          % (r + 1, rounds, comp.title.split(".")[0], label,
                             (comp.a_name, comp.b_name)[index], value),
                          file=sys.stderr, flush=True)

    scale = os.environ.get("BENCH_STEPS_SCALE", "1")
    print("## Training throughput: Accelerant vs PyTorch\n")
    print("Command: `bench/compare_training.py %s %d`. Median samples/s (all processes together) "
          "of %d interleaved rounds, the side that runs first alternating. Synthetic "
          "MNIST-shaped data, batch %d per process, SGD (lr 0.01, momentum 0.9), cross entropy. "
          "Steps/warmup: cnn %d/%d, mlp %d/%d (BENCH_STEPS_SCALE=%s). Python side: Debian's "
          "python3-torch %s.\n"
          % (build, rounds, rounds, BATCH, *steps_for("cnn"), *steps_for("mlp"), scale,
             torch_version()))
    for comp in comps:
        print_comparison(comp)


if __name__ == "__main__":
    main()
