#!/usr/bin/python3
"""Launch latency, Accelerant vs torchrun, measured side by side (interleaved) in one run.

For each world size N, starts these alternately, RUNS times each:
  - accelerant launch -n N bench_launch_latency --worker   (the CLI: fork+exec of C++ workers)
  - bench_launch_latency N                                 (accelerant::launch: forked workers)
  - torchrun --nproc_per_node N trivial_worker.py          (the goal's comparison: Python workers)
  - torchrun --no_python ... bench_launch_latency --worker (torchrun starting our C++ worker)
  - the same N workers started directly, side by side, with the torchrun variables and rank 0
    hosting the store (no launcher at all: the workers' own LibTorch start and rendezvous floor)
and records launch -> all workers ready (the last READY timestamp minus the start, both
CLOCK_MONOTONIC) and the end-to-end wall time. It also times `bench_launch_latency --noop`, a
LibTorch program that returns at once (the floor that every C++ LibTorch process pays to start),
against `accelerant --version`, whose front end does not load LibTorch (issue 21).
Prints two Markdown sections on stdout.
Usage: compare_launch.py BUILD_DIR [RUNS]
"""
import os
import re
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GOAL = 0.10  # the goal: Accelerant's ready time at most 1/10 of torchrun's
# Issue 21, "A CLI that starts in milliseconds":
VERSION_GOAL = 1 / 20  # `accelerant --version` at most 1/20 of a no-op LibTorch program
CLI_GOAL = 0.20  # `accelerant launch -n 2` ready at most 0.2 of torchrun's
OVERHEAD_GOAL = 0.050  # ... and at most 50 ms above the workers started without a launcher


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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure_direct(worker, n):
    """N workers started at once by this script, rank 0 hosting the store: no launcher."""
    port = free_port()
    start = time.monotonic()
    procs = []
    for rank in range(n):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(n), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        procs.append(subprocess.Popen(worker, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    ready = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        if p.returncode != 0:
            raise SystemExit("%s failed (exit %d):\n%s%s" % (" ".join(worker), p.returncode, out, err))
        ready += [float(x) for x in re.findall(r"READY (\d+\.\d{6})", out)]
    end = time.monotonic()
    if len(ready) != n:
        raise SystemExit("direct start: %d READY lines of %d" % (len(ready), n))
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
    # Interleaved: the no-op LibTorch program and the front end's --version.
    noop_times, version_times = [], []
    for _ in range(max(runs, 10)):
        noop_times.append(wall([bench, "--noop"]))
        version_times.append(wall([cli, "--version"]))
    floor = statistics.median(noop_times)
    version = statistics.median(version_times)
    rows = []
    for n in (2, 4):
        sides = {
            "cli": [cli, "launch", "-n", str(n), "--main_process_port", "0", bench, "--worker"],
            "fork": [bench, str(n)],
            "torchrun": torchrun + ["--nproc_per_node", str(n), os.path.join(HERE, "trivial_worker.py")],
            "torchrun_cpp": torchrun + ["--nproc_per_node", str(n), "--no_python", bench, "--worker"],
        }
        results = {name: [] for name in sides}
        results["direct"] = []
        for _ in range(runs):
            for name, cmd in sides.items():
                results[name].append(measure(cmd, n))
            results["direct"].append(measure_direct([bench, "--worker"], n))
        med = {name: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
               for name, rs in results.items()}
        rows.append((n, med))

    print("## The command line starts without LibTorch (issue 21)\n")
    print("Command: `bench/compare_launch.py %s %d` (run by `make bench`), the same run as the next "
          "section. The `accelerant` front end links no LibTorch (`env` and `test` run in the helper "
          "libexec/accelerant/accelerant-libtorch); *no-op LibTorch program* = "
          "`bench_launch_latency --noop`, linked to LibTorch, returning at once (median of %d "
          "interleaved runs each). *Workers alone* = the same workers as under `accelerant launch`, "
          "started side by side by the script with the torchrun variables, rank 0 hosting the store: "
          "the workers' own LibTorch start and rendezvous, with no launcher.\n"
          % (build, runs, max(runs, 10)))
    print("| measure | value | goal | |")
    print("|---|---:|---:|---|")
    ratio = version / floor
    print("| `accelerant --version` | %.4f s | | |" % version)
    print("| no-op LibTorch program | %.3f s | | |" % floor)
    print("| `--version` / no-op LibTorch program | %.3f (1/%.0f) | ≤ %.3f (1/20) | %s |"
          % (ratio, 1 / ratio, VERSION_GOAL, "met" if ratio <= VERSION_GOAL else "missed"))
    for n, med in rows:
        if n != 2:
            continue
        cli_ready, direct_ready, torchrun_ready = med["cli"][0], med["direct"][0], med["torchrun"][0]
        r = cli_ready / torchrun_ready
        print("| `accelerant launch -n 2` ready | %.3f s | | |" % cli_ready)
        print("| torchrun (Python workers) ready | %.3f s | | |" % torchrun_ready)
        print("| `accelerant launch -n 2` / torchrun | %.2f | ≤ %.2f | %s |"
              % (r, CLI_GOAL, "met" if r <= CLI_GOAL else "missed"))
        print("| 2 workers alone ready (floor) | %.3f s | | |" % direct_ready)
        over = cli_ready - direct_ready
        print("| launcher overhead over the floor | %+.0f ms | ≤ %.0f ms | %s |"
              % (over * 1000, OVERHEAD_GOAL * 1000, "met" if over <= OVERHEAD_GOAL else "missed"))
    print()
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
             ("torchrun_cpp", "torchrun `--no_python` (the same C++ worker; reference)", False),
             ("direct", "no launcher: the workers started side by side (floor)", False)]
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
          "runs their static initialisers. Every C++ worker pays it (in parallel over %d cores), "
          "so the workers alone set the floor; `accelerant launch` no longer pays it itself (its "
          "front end does not load LibTorch), and the rest of its ready time is the rendezvous. "
          "torchrun's own start is most of its time even with the same C++ worker.\n"
          % (floor, max(runs, 10), os.cpu_count()))


if __name__ == "__main__":
    main()
