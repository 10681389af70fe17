#!/usr/bin/python3
"""Launch latency, Accelerant vs torchrun, measured side by side (interleaved) in one run.

For each world size N, starts these alternately, RUNS times each:
  - accelerant launch -n N bench_launch_latency --worker   (the CLI: fork+exec of C++ workers)
  - bench_launch_latency N                                 (accelerant::launch: forked workers)
  - torchrun --nproc_per_node N trivial_worker.py          (the goal's comparison: Python workers)
  - torchrun --no_python ... bench_launch_latency --worker (torchrun starting our C++ worker)
and records launch -> all workers ready (the last READY timestamp minus the start, both
CLOCK_MONOTONIC) and the end-to-end wall time. It also times `bench_launch_latency --noop`, a
LibTorch program that returns at once: the floor that every C++ LibTorch process pays to start.
Prints a Markdown section on stdout.
Usage: compare_launch.py BUILD_DIR [RUNS]
"""
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GOAL = 0.10  # the goal: Accelerant's ready time at most 1/10 of torchrun's


def measure(cmd, n):
    start = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    end = time.monotonic()
    # torchrun --tee prefixes lines with "[default0]:" and may interleave them mid-line
    ready = [float(x) for x in re.findall(r"READY (\d+\.\d{6})", out.stdout)]
    if out.returncode != 0 or len(ready) != n:
        raise SystemExit("%s failed (exit %d, %d READY lines):\n%s%s"
                         % (" ".join(cmd), out.returncode, len(ready), out.stdout, out.stderr))
    return max(ready) - start, end - start


def wall(cmd):
    start = time.monotonic()
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    return time.monotonic() - start


def main():
    build = sys.argv[1]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["XDG_CACHE_HOME"] = "/nonexistent"  # no user config file for accelerant launch
    bench = os.path.join(build, "bin", "bench_launch_latency")
    cli = os.path.join(build, "bin", "accelerant")
    torchrun = ["/usr/bin/python3", "-m", "torch.distributed.run", "--standalone", "--redirects", "1",
                "--tee", "1"]
    floor = statistics.median(wall([bench, "--noop"]) for _ in range(runs))
    rows = []
    for n in (2, 4):
        sides = {
            "cli": [cli, "launch", "-n", str(n), "--main_process_port", "0", bench, "--worker"],
            "fork": [bench, str(n)],
            "torchrun": torchrun + ["--nproc_per_node", str(n), os.path.join(HERE, "trivial_worker.py")],
            "torchrun_cpp": torchrun + ["--nproc_per_node", str(n), "--no_python", bench, "--worker"],
        }
        results = {name: [] for name in sides}
        for _ in range(runs):
            for name, cmd in sides.items():
                results[name].append(measure(cmd, n))
        med = {name: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
               for name, rs in results.items()}
        rows.append((n, med))

    print("## Launch latency: accelerant launch and accelerant::launch vs torchrun\n")
    print("Command: `bench/compare_launch.py %s %d` (run by `make bench`), OMP_NUM_THREADS=1 for all. "
          "Median of %d interleaved runs each. *Ready* = from starting the launcher to the last "
          "worker passing a barrier after joining the Gloo group; *end to end* = until the launcher "
          "exited. Accelerant's worker is `bench_launch_latency --worker` (ProcessState::get(), "
          "barrier). torchrun is Debian's python3-torch 1.13 (`--standalone --redirects 1 --tee 1`) "
          "running bench/trivial_worker.py (import torch.distributed, init_process_group(\"gloo\"), "
          "barrier()), and, as a reference, the same C++ worker as ours (`--no_python`). Goal: "
          "`accelerant launch` ready in at most 1/10 of torchrun's time.\n" % (build, runs, runs))
    print("| workers | launcher | ready | end to end | ready vs torchrun | goal ≤ %.2f |" % GOAL)
    print("|---:|---|---:|---:|---:|---|")
    names = [("cli", "`accelerant launch` (C++ workers, fork+exec)", True),
             ("fork", "`accelerant::launch` (forked workers)", False),
             ("torchrun", "torchrun (Python workers)", False),
             ("torchrun_cpp", "torchrun `--no_python` (the same C++ worker; reference)", False)]
    for n, med in rows:
        base = med["torchrun"][0]
        for name, label, judged in names:
            ready, end = med[name]
            ratio = ready / base
            verdict = ("met" if ratio <= GOAL else "missed") if judged else "—"
            print("| %d | %s | %.3f s | %.3f s | %.2f | %s |" % (n, label, ready, end, ratio, verdict))
    print()
    print("Where the time goes: a LibTorch program that returns at once (`bench_launch_latency --noop`) "
          "takes %.3f s here (median of %d): Debian's LibTorch loads about 290 shared libraries and "
          "runs their static initialisers. `accelerant launch` pays it twice in sequence (the "
          "launcher, then each worker, the workers in parallel over %d cores), so it cannot reach "
          "the goal with these libraries; the rest of its ready time is the rendezvous. torchrun's "
          "own start is most of its time even with the same C++ worker.\n" % (floor, runs, os.cpu_count()))


if __name__ == "__main__":
    main()
