#!/usr/bin/python3
"""Time to accuracy on Fashion-MNIST: Accelerant's example against its PyTorch DDP twin.

Runs two commands alternately, round by round (the side that goes first alternating), and prints
a Markdown section on stdout; progress goes to stderr:

  Accelerant:  BUILD/bin/fashion_mnist --world_size 2 --epochs E
               (the example as it is: it forks its 2 workers and picks their threads itself)
  PyTorch:     OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 -m torch.distributed.run
               --standalone --nproc_per_node 2 --redirects 1 --tee 1
               bench/fashion_mnist_twin.py --epochs E
               (the same network, Adam lr 2e-3, batch 64 per process, seed 42, data, sharding and
               evaluation; DistributedDataParallel over gloo; 1 intra-op thread per process.
               Debian's torchrun 1.13 crashes on Python 3.11 without `--redirects 1 --tee 1`)

For each run the wall time is taken from just before the launch (time.monotonic() before Popen)
to each line as it arrives on the command's stdout or stderr, read line by line:

  - the first training step is next: the example's `Training on ...` line (stdout, printed after
    prepare()), the twin's `READY` line;
  - an epoch's training is done: the example's progress line at 100% (`epoch n/E: 100% ...`,
    stderr, printed after the epoch's last step), the twin's `TRAINED n`;
  - an epoch's test accuracy: `epoch n/E: test accuracy X%` and `EPOCH n ACCURACY X`;
  - the exit of the command.

The table gives, per epoch, the median over the rounds of the seconds from launch to that
epoch's accuracy line, both sides' accuracies and the ratio Accelerant / PyTorch; the goal is
≤ 0.6× at equal accuracy (within 0.5 points). The breakdown splits the same runs into start
(launch to the first training step), training and evaluation per epoch, and the end (last
accuracy line to exit), from those markers, measured and not estimated.

Usage: time_to_accuracy.py BUILD_DIR [ROUNDS [EPOCHS]]    (ROUNDS defaults to 2, EPOCHS to 3)
"""
import os
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = "/usr/bin/python3"  # Debian's python3 with python3-torch 1.13
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
GOAL_RATIO = 0.6
GOAL_POINTS = 0.5
TORCHRUN_PREFIX = re.compile(r"^\[default\d+\]:")  # what `--tee 1` puts before a rank's line


# ---------------------------------------------------------------------------------------------
# The two sides: a command, its environment, and the regexes of its markers


class Side:
    def __init__(self, name, cmd, threads_env, start_re, trained_re, accuracy_re, note):
        self.name, self.cmd = name, cmd
        self.threads_env = threads_env  # None: no *_NUM_THREADS at all, the program picks
        self.start_re = re.compile(start_re)  # groups: threads per process
        self.trained_re = re.compile(trained_re)  # group: epoch
        self.accuracy_re = re.compile(accuracy_re)  # groups: epoch, accuracy
        self.note = note
        self.runs = []

    def env(self):
        env = dict(os.environ)
        for var in THREAD_VARS:
            env.pop(var, None)
        if self.threads_env is not None:
            env["OMP_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = str(self.threads_env)
        return env

    def markdown(self):
        prefix = "" if self.threads_env is None else \
            "OMP_NUM_THREADS=%d OPENBLAS_NUM_THREADS=%d " % (self.threads_env, self.threads_env)
        return "`%s%s`" % (prefix, shlex.join(self.cmd))


def sides(build, epochs):
    accelerant = Side(
        "Accelerant",
        [os.path.join(build, "bin", "fashion_mnist"), "--world_size", "2",
         "--epochs", str(epochs)],
        None,
        r"^Training on \d+ process(?:es)? x (\d+) thread",
        r"^epoch (\d+)/\d+: 100% ",
        r"^epoch (\d+)/\d+: test accuracy ([0-9.eE+-]+)%",
        "the example unchanged; threads chosen by the library")
    twin = os.path.relpath(os.path.join(HERE, "fashion_mnist_twin.py"))
    pytorch = Side(
        "PyTorch DDP",
        [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "--redirects", "1", "--tee", "1", twin, "--epochs", str(epochs)],
        1,
        r"^READY world=\d+ threads=(\d+)",
        r"^TRAINED (\d+)$",
        r"^EPOCH (\d+) ACCURACY ([0-9.]+)$",
        "bench/fashion_mnist_twin.py under Debian's torchrun, gloo, 1 thread per process")
    return [accelerant, pytorch]


# ---------------------------------------------------------------------------------------------
# One timed run


def read_lines(stream, name, t0, lines, lock):
    for line in stream:
        now = time.monotonic() - t0
        with lock:
            lines.append((now, name, line.rstrip("\n")))


def timed_run(side, epochs, timeout_s):
    """Runs the side's command once; returns a dict of seconds since the launch: start, trained
    [per epoch], accuracy [per epoch], exit, plus accuracies [%] and threads."""
    lines, lock = [], threading.Lock()
    t0 = time.monotonic()
    proc = subprocess.Popen(side.cmd, env=side.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, bufsize=1,
                            start_new_session=True)  # its own group: a timeout kills it whole
    readers = [threading.Thread(target=read_lines, args=(s, n, t0, lines, lock), daemon=True)
               for s, n in ((proc.stdout, "stdout"), (proc.stderr, "stderr"))]
    for r in readers:
        r.start()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
    exit_s = time.monotonic() - t0
    for r in readers:
        r.join(timeout=10)
    timed_out = exit_s >= timeout_s

    run = {"start": None, "threads": None, "trained": {}, "accuracy": {}, "percent": {},
           "exit": exit_s}
    for when, _, raw in lines:
        line = TORCHRUN_PREFIX.sub("", raw)
        m = side.start_re.search(line)
        if m and run["start"] is None:
            run["start"], run["threads"] = when, int(m.group(1))
        m = side.trained_re.search(line)
        if m:
            run["trained"].setdefault(int(m.group(1)), when)
        m = side.accuracy_re.search(line)
        if m:
            run["accuracy"].setdefault(int(m.group(1)), when)
            run["percent"].setdefault(int(m.group(1)), float(m.group(2)))

    missing = [what for what, ok in (
        ("the start marker", run["start"] is not None),
        ("a 100%/TRAINED line for every epoch", sorted(run["trained"]) == list(range(1, epochs + 1))),
        ("an accuracy line for every epoch", sorted(run["accuracy"]) == list(range(1, epochs + 1))),
    ) if not ok]
    if timed_out or proc.returncode != 0 or missing:
        why = "timed out after %d s" % timeout_s if timed_out else \
            "exit code %d" % proc.returncode if proc.returncode != 0 else \
            "missing " + ", ".join(missing)
        tail = "\n".join("%8.2f %s %s" % line for line in lines[-60:])
        raise SystemExit("benchmark command failed (%s):\n  %s\n--- output tail (s since launch, "
                         "stream, line) ---\n%s" % (why, shlex.join(side.cmd), tail))
    return run


def parts(run, epochs):
    """The run split at its markers: start, training and evaluation per epoch, end."""
    train, evaluate = [], []
    previous = run["start"]
    for e in range(1, epochs + 1):
        train.append(run["trained"][e] - previous)
        evaluate.append(run["accuracy"][e] - run["trained"][e])
        previous = run["accuracy"][e]
    return {"start": run["start"], "train": train, "eval": evaluate,
            "end": run["exit"] - run["accuracy"][epochs]}


# ---------------------------------------------------------------------------------------------
# Markdown


def spread(values, fmt):
    """The median, and the range when the runs differ."""
    med = fmt % statistics.median(values)
    low, high = fmt % min(values), fmt % max(values)
    return med if low == high else "%s (%s–%s)" % (med, low, high)


def torch_version():
    out = subprocess.run([PYTHON, "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def print_markdown(build, rounds, epochs, both):
    a, b = both
    print("## Time to accuracy: Accelerant vs PyTorch DDP, Fashion-MNIST, 2 processes\n")
    print("Command: `bench/time_to_accuracy.py %s %d %d`. %d interleaved round%s, the side that "
          "runs first alternating; medians over the rounds (the range in brackets where the runs "
          "differ). Both sides train examples/fashion_mnist's CNN with Adam (lr 2e-3), cross "
          "entropy, batch 64 per process, seed 42, Accelerant's sharding (one permutation per "
          "epoch from seed + epoch, interleaved steps, even_batches) and evaluate the whole test "
          "set (batch 500 per process) after every epoch. Seconds from just before the launch to "
          "the line as it arrives. Threads per process, as each side reported them: Accelerant "
          "%s, PyTorch %s. Python side: Debian's python3-torch %s.\n"
          % (build, rounds, epochs, rounds, "" if rounds == 1 else "s",
             "/".join(sorted({str(r["threads"]) for r in a.runs})),
             "/".join(sorted({str(r["threads"]) for r in b.runs})), torch_version()))
    for side in both:
        print("- %s (%s): %s" % (side.name, side.note, side.markdown()))
    print()

    print("| epoch | %s s to accuracy | %s accuracy %% | %s s to accuracy | %s accuracy %% | "
          "%s / %s | goal | result |" % (a.name, a.name, b.name, b.name, a.name, b.name))
    print("|---|---:|---:|---:|---:|---:|---|---|")
    verdict = None
    for e in range(1, epochs + 1):
        at = [r["accuracy"][e] for r in a.runs]
        bt = [r["accuracy"][e] for r in b.runs]
        ap = [r["percent"][e] for r in a.runs]
        bp = [r["percent"][e] for r in b.runs]
        ratio = statistics.median(at) / statistics.median(bt)
        equal = abs(statistics.median(ap) - statistics.median(bp)) <= GOAL_POINTS
        met = ratio <= GOAL_RATIO and equal
        result = "met" if met else "missed" + ("" if equal else " (accuracy differs)")
        if e == epochs:
            verdict = (ratio, met, result)
        print("| %d | %s | %s | %s | %s | %.2f× | ≤ %.1f× at equal accuracy (within %.1f "
              "points) | %s |"
              % (e, spread(at, "%.1f"), spread(ap, "%.2f"), spread(bt, "%.1f"),
                 spread(bp, "%.2f"), ratio, GOAL_RATIO, GOAL_POINTS, result))
    ax, bx = [r["exit"] for r in a.runs], [r["exit"] for r in b.runs]
    print("| exit (whole run) | %s | — | %s | — | %.2f× | — | — |"
          % (spread(ax, "%.1f"), spread(bx, "%.1f"), statistics.median(ax) / statistics.median(bx)))
    print()
    print("Goal ≤ %.1f× at equal accuracy (within %.1f points), judged at the last epoch (%d): "
          "**%s** (%.2f×).\n" % (GOAL_RATIO, GOAL_POINTS, epochs, verdict[2], verdict[0]))

    pa = [parts(r, epochs) for r in a.runs]
    pb = [parts(r, epochs) for r in b.runs]
    print("Where the time goes, from the same runs (medians; training and evaluation: median over "
          "epochs and rounds, one epoch's worth):\n")
    print("| part | %s s | %s s | measured as |" % (a.name, b.name))
    print("|---|---:|---:|---|")
    rows = [
        ("start: launch → first training step",
         [p["start"] for p in pa], [p["start"] for p in pb],
         "launch → the example's `Training on …` line (after reading the data in the parent, "
         "forking, joining the group and prepare's broadcast) / the twin's `READY` (torchrun's "
         "start, Python and torch imports, both ranks reading the data, init_process_group, "
         "DDP's broadcast)"),
        ("training, one epoch",
         [x for p in pa for x in p["train"]], [x for p in pb for x in p["train"]],
         "start marker or previous accuracy line → the example's 100% progress line / "
         "`TRAINED n` (the epoch's steps)"),
        ("evaluation, one epoch",
         [x for p in pa for x in p["eval"]], [x for p in pb for x in p["eval"]],
         "100% progress line / `TRAINED n` → the accuracy line (10 test steps of 500 per "
         "process and their collectives)"),
        ("end: last accuracy → exit",
         [p["end"] for p in pa], [p["end"] for p in pb],
         "last accuracy line → the command's exit (end_training / barrier, process teardown, "
         "torchrun's shutdown)"),
    ]
    for label, av, bv, how in rows:
        print("| %s | %s | %s | %s |" % (label, spread(av, "%.2f"), spread(bv, "%.2f"), how))
    print()
    print("The PyTorch side's lines reach this script through torchrun's `--tee`, which polls the "
          "rank's log file every 0.1 s: each of its marks may be up to 0.1 s late. The start part "
          "cannot be split further from the outside: the example prints nothing between its "
          "launch and `Training on …` (`--epochs 0` is refused), and the twin prints nothing "
          "before `READY`.\n")


# ---------------------------------------------------------------------------------------------
# Main


def main():
    if len(sys.argv) not in (2, 3, 4):
        raise SystemExit(__doc__)
    build = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) >= 3 else 2
    epochs = int(sys.argv[3]) if len(sys.argv) == 4 else 3
    if rounds < 1 or epochs < 1:
        raise SystemExit("ROUNDS and EPOCHS must be 1 or more")
    binary = os.path.join(build, "bin", "fashion_mnist")
    if not os.access(binary, os.X_OK):
        raise SystemExit("%s not found or not executable: build it first" % binary)
    timeout_s = 300 + 300 * epochs

    both = sides(build, epochs)
    for r in range(rounds):
        order = both if r % 2 == 0 else list(reversed(both))
        for side in order:
            print("round %d/%d  %s: running %s" % (r + 1, rounds, side.name, side.markdown()),
                  file=sys.stderr, flush=True)
            run = timed_run(side, epochs, timeout_s)
            side.runs.append(run)
            print("round %d/%d  %s: first step at %.2f s; %s; exit %.2f s"
                  % (r + 1, rounds, side.name, run["start"],
                     ", ".join("epoch %d %.2f%% at %.2f s" % (e, run["percent"][e],
                                                               run["accuracy"][e])
                               for e in range(1, epochs + 1)), run["exit"]),
                  file=sys.stderr, flush=True)
    print_markdown(build, rounds, epochs, both)


if __name__ == "__main__":
    main()
