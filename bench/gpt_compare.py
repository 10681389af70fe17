#!/usr/bin/python3
"""GPT on tiny Shakespeare: Accelerant's examples/gpt against its PyTorch twin (issue 33).

Runs two commands alternately, for each process count and round by round (the side that goes
first alternating with the round), and writes every run's measurements to a JSON file that
bench/render_gpt.py turns into Markdown; progress goes to stderr:

  Accelerant:  BUILD/bin/gpt --input FILE --world_size P --batch_size 12/P --max_iters M
               --out_dir TMPDIR
               (the example as it is: it forks its P workers and picks their threads itself, so
               no *_NUM_THREADS is set for it)
  PyTorch:     OMP_NUM_THREADS=T MKL_NUM_THREADS=T OPENBLAS_NUM_THREADS=1
               /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node P
               --redirects 1 --tee 1 bench/gpt_twin.py --input FILE --batch_size 12/P
               --max_iters M --threads T                                       (T = 2 / P)
               and for P = 1 the twin alone, without torchrun:
               ... /usr/bin/python3 bench/gpt_twin.py --input FILE --batch_size 12 --max_iters M
               --threads 2
               (nanoGPT's shakespeare_char CPU configuration; DistributedDataParallel over gloo.
               Debian's torchrun 1.13 crashes on Python 3.11 without `--redirects 1 --tee 1`)

OpenBLAS's own thread pool is set to 1 thread for the twin (--twin_blas_threads): on this 2-core
machine, 2 intra-op threads + 2 OpenBLAS threads ran the twin's 100 iterations in 20.0 and 22.8 s,
against 9.6 s with OpenBLAS at 1 (and 9.7 s at 1 + 1), the two pools competing for the cores
(docs: "Intra-op threads and OpenBLAS threads are separate pools"). That is the twin at its
fastest, not at the defaults a nanoGPT user would get (2 + 2 here); `--twin_blas_threads 2`
measures those instead. On 2 processes both are 1 either way.

Both sides train the same global batch (12 windows of 64 characters per iteration) on 1 and on
2 processes. `--eval_interval N` and `--eval_iters N`, when given, are passed to both sides (for
short trial runs); otherwise both use their defaults (250 and 20, nanoGPT's).

For each run the time is taken from just before the launch (time.monotonic() before Popen) to
each line as it arrives on the command's stdout or stderr, read line by line (torchrun's
`[default0]:` prefix removed; torchrun's --tee polls the rank's log every 0.1 s, so the twin's
lines under torchrun may arrive up to 0.1 s late). The lines both sides print:

  READY world=W threads=T  (twin) / `Training on ...` (example)    the first iteration is next
  step N: train loss X.XXXX, val loss Y.YYYY                       an evaluation at iteration N
  val loss over the whole validation split: Z.ZZZZ                 at the end
  done: I iterations                                               last

Recorded per run: the curve [(iteration, train loss, val loss, seconds since launch)], the
seconds to the first evaluation with val loss <= 1.88 (null if none), the last evaluation's val
loss, the whole-split val loss, the wall time to exit, tokens/s = the tokens trained between the
evaluation at the first eval_interval and the last evaluation (iterations x global batch x block
x accumulation) / the seconds between those two lines (evaluations in between included, on both
sides alike), the exit status, and for a failing or incomplete run its last 20 lines of output
(the driver goes on). The summary holds, per side and process count, the medians over the runs
that completed (a run that never reached 1.88 counts as infinitely slow: a median that falls on
one is null).

--preset gpu (scripts/gpu-check runs it on the device machine) measures nanoGPT's GPU
configuration instead (config/train_shakespeare_char.py: 6 layers, 6 heads, 384 wide, context
256, batch 64, dropout 0.2, lr 1e-3 to 1e-4 with 100 warmup iterations and the cosine to 5000,
beta2 0.99) on 1 process, bf16 autocast on both sides, for a fixed --max_iters (default 300,
evaluated every 100 iterations over 20 batches, so that tokens/s spans iterations 100 to 300):

  Accelerant:  BUILD/bin/gpt --input FILE --world_size 1 --batch_size 64 --max_iters 300
               --dtype bfloat16 --eval_interval 100 --eval_iters 20 --n_layer 6 ... --compile true
               --fused true --num_samples 0 --out_dir TMPDIR
               (graph mode: CUDA graphs; Accelerant's fused AdamW; no sample at the end)
  PyTorch:     PYTHON bench/gpt_twin.py --input FILE --batch_size 64 ... --device cuda
               (eager, no torch.compile; torch.optim.AdamW at its defaults; no *_NUM_THREADS, no --threads)

PYTHON there is the Python running this script (the device machine's pip torch 2.x; Debian's
/usr/bin/python3 may have no torch), $GPT_COMPARE_PYTHON when set (either preset). Its goal:
Accelerant's tokens/s >= 1.3x the twin's on the same GPU. There is no target val loss (300
iterations are far from nanoGPT's 1.47 at 5000): both sides' val losses are recorded. A dry run
without a GPU: GPT_COMPARE_DEVICE=cpu gives the twin --device cpu (the example picks the CPU by
itself when it sees no GPU), with --max_iters, --eval_interval and --eval_iters small.

Usage: gpt_compare.py BUILD_DIR --input FILE [--preset cpu|gpu] [--rounds R] [--processes 1,2]
                      [--max_iters 2000] [--out bench/results/gpt_cpu.json] [--eval_interval N]
                      [--eval_iters N] [--timeout S] [--twin_blas_threads N]
"""
import argparse
import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PYTHON = "/usr/bin/python3"  # Debian's python3 with python3-torch 1.13
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
CORES_FOR_TWIN = 2  # the twin's threads per process: 2 / P
GLOBAL_BATCH = 12  # windows per iteration over all processes (nanoGPT's batch_size)
BLOCK_SIZE = 64  # characters per window (both sides' default)
ACCUMULATION = 1  # gradient_accumulation_steps (both sides' default)
TARGET_VAL_LOSS = 1.88  # nanoGPT's published val loss for this configuration
GOALS = {  # issue 33's goals, judged by render_gpt.py from the summary
    "val_loss_max": 1.89,  # Accelerant, 1 process, at iteration `iteration`
    "iteration": 2000,
    "processes_val_loss_within": 0.03,  # Accelerant: |val(2 processes) - val(1 process)|
    "time_ratio_max": {"1": 0.7, "2": 0.6},  # Accelerant / PyTorch seconds to TARGET_VAL_LOSS
}
# --preset gpu: nanoGPT's config/train_shakespeare_char.py (its GPU configuration), 1 process.
GPU_GLOBAL_BATCH = 64
GPU_BLOCK_SIZE = 256
GPU_MODEL = (  # passed to both sides as --NAME VALUE, after the common flags
    ("n_layer", "6"), ("n_head", "6"), ("n_embd", "384"), ("block_size", str(GPU_BLOCK_SIZE)),
    ("dropout", "0.2"), ("learning_rate", "1e-3"), ("min_lr", "1e-4"), ("beta2", "0.99"),
    ("warmup_iters", "100"), ("lr_decay_iters", "5000"))
# The example's own flags: graph mode, the fused AdamW (its default, said), and no sample at the
# end (the twin samples none: 500 characters would only lengthen the run's wall time).
GPU_ACCELERANT = ("--compile", "true", "--fused", "true", "--num_samples", "0")
GPU_GOALS = {"tokens_per_s_ratio_min": 1.3}  # Accelerant / the twin (eager) on the same GPU
# Per preset: the defaults of the options left out, and what the runs are measured against.
PRESETS = {
    "cpu": {"global_batch": GLOBAL_BATCH, "block_size": BLOCK_SIZE, "max_iters": 2000,
            "processes": "1,2", "dtype": "float32", "eval_interval": None, "eval_iters": None,
            "timeout_base_s": 600.0, "model": (), "accelerant": (),
            "target_val_loss": TARGET_VAL_LOSS, "goals": GOALS},
    "gpu": {"global_batch": GPU_GLOBAL_BATCH, "block_size": GPU_BLOCK_SIZE, "max_iters": 300,
            "processes": "1", "dtype": "bfloat16", "eval_interval": 100, "eval_iters": 20,
            "timeout_base_s": 300.0, "model": GPU_MODEL, "accelerant": GPU_ACCELERANT,
            "target_val_loss": None, "goals": GPU_GOALS},
}
TAIL_LINES = 20
SIDES = ("accelerant", "pytorch")
NAMES = {"accelerant": "Accelerant", "pytorch": "PyTorch DDP"}
GPU_NAMES = {"accelerant": "Accelerant", "pytorch": "PyTorch (eager)"}  # --preset gpu

TORCHRUN_PREFIX = re.compile(r"^\[default\d+\]:")
NUMBER = r"([-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|nan|inf))"
READY_RE = re.compile(r"^(?:READY world=\d+ threads=(\d+)|Training on (.*))")
THREADS_IN_TRAINING_ON = re.compile(r"(\d+) thread")
STEP_RE = re.compile(r"^step (\d+): train loss %s, val loss %s" % (NUMBER, NUMBER))
WHOLE_RE = re.compile(r"^val loss over the whole validation split: %s" % NUMBER)
DONE_RE = re.compile(r"^done: (\d+) iterations")


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        usage="%(prog)s BUILD_DIR --input FILE [--preset cpu|gpu] [--rounds R] [--processes 1,2] "
              "[--max_iters 2000] [--out bench/results/gpt_cpu.json]")
    p.add_argument("build", metavar="BUILD_DIR", help="the build folder holding bin/gpt")
    p.add_argument("--input", required=True, help="the text both sides train on")
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu",
                   help="nanoGPT's CPU configuration (default) or its GPU one, on the GPU "
                        "(see the module docstring); it sets the defaults of the options below")
    p.add_argument("--rounds", type=int, default=3, help="runs of each side per process count")
    p.add_argument("--processes", default=None,
                   help="comma-separated process counts (default 1,2; gpu: 1, the only choice)")
    p.add_argument("--max_iters", type=int, default=None, help="default 2000 (gpu: 300)")
    p.add_argument("--out", default=os.path.join("bench", "results", "gpt_cpu.json"))
    p.add_argument("--eval_interval", type=int, default=None,
                   help="passed to both sides when given (default: theirs, 250; gpu: 100)")
    p.add_argument("--eval_iters", type=int, default=None,
                   help="passed to both sides when given (default: theirs, 20; gpu: 20)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds before a run is killed (default 600 + 1 s per iteration; "
                        "gpu: 300 + 1 s per iteration)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                   help="both sides' precision: float32 (nanoGPT's on a CPU; the default) or "
                        "bfloat16 autocast (gpu's default)")
    p.add_argument("--twin_blas_threads", type=int, default=1,
                   help="OPENBLAS_NUM_THREADS for the twin (default 1: its fastest here), "
                        "at most its threads per process")
    a = p.parse_args()
    # The preset's defaults for the options left out, and its constants as a.global_batch,
    # a.block_size, a.model (flags of both sides), a.accelerant (flags of the example only),
    # a.target_val_loss (None: none) and a.goals.
    preset = PRESETS[a.preset]
    for name in ("processes", "max_iters", "dtype", "eval_interval", "eval_iters"):
        if getattr(a, name) is None:
            setattr(a, name, preset[name])
    for name in ("global_batch", "block_size", "model", "accelerant", "target_val_loss", "goals"):
        setattr(a, name, preset[name])
    try:
        a.processes = [int(x) for x in a.processes.split(",") if x.strip()]
    except ValueError:
        p.error("--processes takes comma-separated integers, e.g. 1,2")
    if not a.processes or any(n < 1 or a.global_batch % n for n in a.processes):
        p.error("each process count must divide the global batch %d" % a.global_batch)
    if a.preset == "gpu" and a.processes != [1]:
        p.error("--preset gpu runs 1 process (one GPU)")
    if a.rounds < 1 or a.max_iters < 1 or a.twin_blas_threads < 1:
        p.error("--rounds, --max_iters and --twin_blas_threads must be 1 or more")
    if a.timeout is None:
        a.timeout = preset["timeout_base_s"] + a.max_iters
    # The twin's Python and (gpu) device: Debian's python3-torch on the CPU; on the GPU the
    # Python running this script. GPT_COMPARE_DEVICE=cpu: a dry run of the gpu preset without one.
    a.python = os.environ.get("GPT_COMPARE_PYTHON") or \
        (PYTHON if a.preset == "cpu" else sys.executable)
    a.twin_device = None
    if a.preset == "gpu":
        a.twin_device = os.environ.get("GPT_COMPARE_DEVICE") or "cuda"
        if a.twin_device not in ("cuda", "cpu"):
            p.error("GPT_COMPARE_DEVICE must be cuda or cpu, not %r" % a.twin_device)
    binary = os.path.join(a.build, "bin", "gpt")
    if not os.access(binary, os.X_OK):
        p.error("%s not found or not executable: build it first" % binary)
    if not os.path.isfile(a.input):
        p.error("--input %s: no such file" % a.input)
    return a


# ---------------------------------------------------------------------------------------------
# The commands


def command(side, a, processes, out_dir):
    """(argv, the *_NUM_THREADS set for it or None) of one run."""
    batch = a.global_batch // processes
    common = ["--input", a.input, "--batch_size", str(batch), "--max_iters", str(a.max_iters)]
    if a.dtype != "float32":
        common += ["--dtype", a.dtype]
    for flag in ("eval_interval", "eval_iters"):
        if getattr(a, flag) is not None:
            common += ["--" + flag, str(getattr(a, flag))]
    for flag, value in a.model:  # none on the cpu preset: both sides' defaults are its own
        common += ["--" + flag, value]
    if side == "accelerant":
        return ([os.path.join(a.build, "bin", "gpt"), "--input", a.input, "--world_size",
                 str(processes)] + common[2:] + list(a.accelerant) + ["--out_dir", out_dir], None)
    twin = os.path.relpath(os.path.join(HERE, "gpt_twin.py"))
    if a.twin_device is not None:
        # gpu: one process, no torchrun; its CPU threads (feeding the GPU) at the twin's default
        return [a.python, twin] + common + ["--device", a.twin_device], None
    threads = max(1, CORES_FOR_TWIN // processes)
    if processes == 1:
        argv = [a.python, twin]
    else:
        argv = [a.python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                str(processes), "--redirects", "1", "--tee", "1", twin]
    blas = min(threads, a.twin_blas_threads)
    return argv + common + ["--threads", str(threads)], \
        {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": blas}


def environment(threads):
    """The environment of a run: no *_NUM_THREADS but those given."""
    env = dict(os.environ)
    for var in THREAD_VARS:
        env.pop(var, None)
    for var, n in (threads or {}).items():
        env[var] = str(n)
    return env


def shown(argv, threads):
    prefix = "".join("%s=%d " % (var, n) for var, n in (threads or {}).items())
    return prefix + shlex.join(argv)


# ---------------------------------------------------------------------------------------------
# One timed run


def read_lines(stream, name, t0, lines, lock):
    for line in stream:
        now = time.monotonic() - t0
        with lock:
            lines.append((now, name, line.rstrip("\n")))


def number(text):
    return float(text)


def timed_run(side, a, processes, round_index, order):
    out_dir = tempfile.mkdtemp(prefix="gpt_compare_")
    argv, threads = command(side, a, processes, out_dir)
    lines, lock = [], threading.Lock()
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=environment(threads), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, bufsize=1, errors="replace",
                            start_new_session=True)  # its own group: a timeout kills it whole
    readers = [threading.Thread(target=read_lines, args=(s, n, t0, lines, lock), daemon=True)
               for s, n in ((proc.stdout, "stdout"), (proc.stderr, "stderr"))]
    for r in readers:
        r.start()
    timed_out = False
    try:
        proc.wait(timeout=a.timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, 9)
        proc.wait()
    wall = time.monotonic() - t0
    for r in readers:
        r.join(timeout=10)
    shutil.rmtree(out_dir, ignore_errors=True)

    run = {"side": side, "processes": processes, "round": round_index + 1, "order": order,
           "command": shown(argv, threads), "threads_env": threads,
           "exit_status": proc.returncode, "timed_out": timed_out, "wall_s": wall,
           "ready_s": None, "threads": None, "curve": [], "seconds_to_target": None,
           "final_iteration": None, "final_val_loss": None, "whole_split_val_loss": None,
           "done_iterations": None, "tokens_per_s": None, "tokens_per_s_window": None}
    with lock:
        seen = list(lines)
    for when, _, raw in seen:
        for piece in raw.split("\r"):  # a progress bar may share the line
            line = TORCHRUN_PREFIX.sub("", piece).strip()
            m = READY_RE.match(line)
            if m and run["ready_s"] is None:
                run["ready_s"] = when
                if m.group(1):
                    run["threads"] = int(m.group(1))
                else:
                    t = THREADS_IN_TRAINING_ON.search(m.group(2))
                    run["threads"] = int(t.group(1)) if t else None
                continue
            m = STEP_RE.match(line)
            if m:
                point = [int(m.group(1)), number(m.group(2)), number(m.group(3)), when]
                run["curve"].append(point)
                if (run["seconds_to_target"] is None and a.target_val_loss is not None
                        and point[2] <= a.target_val_loss):
                    run["seconds_to_target"] = when
                continue
            m = WHOLE_RE.match(line)
            if m:
                run["whole_split_val_loss"] = number(m.group(1))
                continue
            m = DONE_RE.match(line)
            if m:
                run["done_iterations"] = int(m.group(1))

    curve = run["curve"]
    if curve:
        run["final_iteration"], run["final_val_loss"] = curve[-1][0], curve[-1][2]
        later = [c for c in curve if c[0] > 0]
        if len(later) >= 2 and later[-1][3] > later[0][3]:
            first, last = later[0], later[-1]
            tokens = (last[0] - first[0]) * a.global_batch * a.block_size * ACCUMULATION
            run["tokens_per_s"] = tokens / (last[3] - first[3])
            run["tokens_per_s_window"] = {"from_iteration": first[0], "to_iteration": last[0],
                                          "from_s": first[3], "to_s": last[3], "tokens": tokens}
    missing = [what for what, ok in (
        ("the start line", run["ready_s"] is not None),
        ("an evaluation at iteration %d" % a.max_iters, run["final_iteration"] == a.max_iters),
        ("the whole-split val loss", run["whole_split_val_loss"] is not None),
        ("`done: %d iterations`" % a.max_iters, run["done_iterations"] == a.max_iters),
    ) if not ok]
    run["missing"] = missing
    run["complete"] = proc.returncode == 0 and not timed_out and not missing
    if not run["complete"]:
        run["output_tail"] = ["%8.2f %s %s" % line for line in seen[-TAIL_LINES:]]
    return run


# ---------------------------------------------------------------------------------------------
# Summary


def median_or_none(values):
    """Median of the values, None when there are none; None stands for 'never' (infinitely
    slow), so a median that falls on one is None."""
    if not values:
        return None
    m = statistics.median([math.inf if v is None else v for v in values])
    return None if math.isinf(m) else m


def summarise(runs, processes):
    summary = []
    for p in processes:
        by_side = {}
        for side in SIDES:
            done = [r for r in runs if r["side"] == side and r["processes"] == p and r["complete"]]
            all_runs = [r for r in runs if r["side"] == side and r["processes"] == p]
            iterations = sorted({c[0] for r in done for c in r["curve"]})
            curve = []
            for it in iterations:
                at = [c for r in done for c in r["curve"] if c[0] == it]
                curve.append([it, statistics.median(c[1] for c in at),
                              statistics.median(c[2] for c in at),
                              statistics.median(c[3] for c in at)])
            entry = {
                "side": side, "processes": p, "runs": len(all_runs), "complete_runs": len(done),
                "reached_target": sum(r["seconds_to_target"] is not None for r in done),
                "final_val_loss": median_or_none([r["final_val_loss"] for r in done]),
                "whole_split_val_loss": median_or_none([r["whole_split_val_loss"] for r in done]),
                "seconds_to_target": median_or_none([r["seconds_to_target"] for r in done]),
                "wall_s": median_or_none([r["wall_s"] for r in done]),
                "ready_s": median_or_none([r["ready_s"] for r in done]),
                "tokens_per_s": median_or_none([r["tokens_per_s"] for r in done
                                                if r["tokens_per_s"] is not None]),
                "curve": curve,
            }
            by_side[side] = entry
            summary.append(entry)
        a, b = by_side["accelerant"], by_side["pytorch"]
        summary.append({
            "side": "ratio accelerant/pytorch", "processes": p,
            "seconds_to_target": ratio(a["seconds_to_target"], b["seconds_to_target"]),
            "tokens_per_s": ratio(a["tokens_per_s"], b["tokens_per_s"]),
            "wall_s": ratio(a["wall_s"], b["wall_s"]),
        })
    return summary


def ratio(x, y):
    return None if x is None or y is None or y == 0 else x / y


# ---------------------------------------------------------------------------------------------
# The machine and the source


def machine():
    return {**provenance.machine(),
            "openblas_env": {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS_")
                             and k not in THREAD_VARS}}


def torch_version(python):
    out = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True)
    return out.stdout.strip() or None


def gpu_name(python):
    """The twin's torch's name of GPU 0 (the one both sides use), None without one."""
    out = subprocess.run([python, "-c", "import torch; print(torch.cuda.get_device_name(0) "
                          "if torch.cuda.is_available() else '')"], capture_output=True, text=True)
    return out.stdout.strip() or None


# ---------------------------------------------------------------------------------------------
# Main


def write(path, result):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def main():
    a = parse_args()
    result = {
        "command": shlex.join(sys.argv),
        **provenance.source(),
        "date": provenance.now(),
        "machine": machine(),
        "config": {
            "preset": a.preset,
            "input": a.input, "rounds": a.rounds, "processes": a.processes,
            "max_iters": a.max_iters, "dtype": a.dtype, "eval_interval": a.eval_interval or 250,
            "eval_iters": a.eval_iters or 20, "global_batch": a.global_batch,
            "batch_size_per_process": {str(p): a.global_batch // p for p in a.processes},
            "block_size": a.block_size, "gradient_accumulation_steps": ACCUMULATION,
            "target_val_loss": a.target_val_loss, "timeout_s": a.timeout,
            "twin_threads_per_process": {str(p): None if a.twin_device else
                                         max(1, CORES_FOR_TWIN // p) for p in a.processes},
            "twin_blas_threads": a.twin_blas_threads,
            "python_torch": torch_version(a.python), "goals": a.goals,
            "commands": {side: {str(p): shown(*command(side, a, p, "TMPDIR"))
                                for p in a.processes} for side in SIDES},
        },
        "runs": [],
        "summary": [],
    }
    if a.preset == "gpu":
        result["config"].update({
            "python": a.python, "twin_device": a.twin_device,
            "model": {flag: value for flag, value in a.model},
            "accelerant_flags": " ".join(a.accelerant)})
        result["machine"]["gpu"] = gpu_name(a.python) if a.twin_device == "cuda" else None
    names = NAMES if a.preset == "cpu" else GPU_NAMES
    for p in a.processes:
        for r in range(a.rounds):
            order = SIDES if r % 2 == 0 else tuple(reversed(SIDES))
            for position, side in enumerate(order):
                print("%d process%s, round %d/%d, %s: %s"
                      % (p, "" if p == 1 else "es", r + 1, a.rounds, names[side],
                         shown(*command(side, a, p, "TMPDIR"))), file=sys.stderr, flush=True)
                run = timed_run(side, a, p, r, position)
                result["runs"].append(run)
                print("    exit %s after %.1f s; start %s s; val loss %s at %s; whole split %s; "
                      "%s; %s tokens/s%s"
                      % (run["exit_status"], run["wall_s"], fmt(run["ready_s"], "%.1f"),
                         fmt(run["final_val_loss"], "%.4f"), run["final_iteration"],
                         fmt(run["whole_split_val_loss"], "%.4f"),
                         "no target val loss" if a.target_val_loss is None else
                         "<= %.2f at %s s" % (a.target_val_loss,
                                              fmt(run["seconds_to_target"], "%.1f")),
                         fmt(run["tokens_per_s"], "%.0f"),
                         "" if run["complete"] else
                         "; INCOMPLETE (%s)" % ("timed out" if run["timed_out"] else
                                                ", ".join(run["missing"]) or "non-zero exit")),
                      file=sys.stderr, flush=True)
                if not run["complete"]:
                    print("    last lines:\n      " + "\n      ".join(run["output_tail"]),
                          file=sys.stderr, flush=True)
                result["summary"] = summarise(result["runs"], a.processes)
                write(a.out, result)  # after every run: an interrupted bench keeps its runs
    print("wrote %s" % a.out, file=sys.stderr, flush=True)


def fmt(value, spec):
    return "—" if value is None else spec % value


if __name__ == "__main__":
    main()
