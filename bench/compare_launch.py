#!/usr/bin/python3
"""Launch latency, Accelerant vs torchrun, measured side by side (interleaved) in one run.

For each world size, starts `bench_launch_latency N` and
`torchrun --standalone --nproc_per_node N trivial_worker.py` alternately, RUNS times each, and
records launch -> all workers ready (the last READY timestamp minus the start, both
CLOCK_MONOTONIC) and the end-to-end wall time. Prints a Markdown section on stdout.
Usage: compare_launch.py BUILD_DIR [RUNS]
"""
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


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


def main():
    build = sys.argv[1]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    env_note = "OMP_NUM_THREADS=1 for both"
    os.environ["OMP_NUM_THREADS"] = "1"
    rows = []
    for n in (2, 4):
        ours = [os.path.join(build, "bin", "bench_launch_latency"), str(n)]
        theirs = ["/usr/bin/python3", "-m", "torch.distributed.run", "--standalone",
                  "--nproc_per_node", str(n), "--redirects", "1", "--tee", "1",
                  os.path.join(HERE, "trivial_worker.py")]
        a, t = [], []
        for _ in range(runs):
            a.append(measure(ours, n))
            t.append(measure(theirs, n))
        med = lambda xs, i: statistics.median(x[i] for x in xs)
        rows.append((n, med(a, 0), med(t, 0), med(a, 1), med(t, 1)))
    print("## Launch latency: accelerant::launch vs torchrun\n")
    print("Command: `bench/compare_launch.py %s %d` (run by `make bench`), %s. Median of %d "
          "interleaved runs each. *Ready* = from starting the launcher to the last worker passing "
          "a barrier after joining the Gloo group; *end to end* = until the launcher exited. "
          "torchrun is Debian's python3-torch 1.13 (`--standalone --redirects 1 --tee 1`) running "
          "a worker that imports torch.distributed, calls init_process_group(\"gloo\") and "
          "barrier().\n" % (build, runs, env_note, runs))
    print("| workers | Accelerant ready | torchrun ready | ratio | Accelerant end to end | torchrun end to end | ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, ar, tr, ae, te in rows:
        print("| %d | %.3f s | %.3f s | %.1f× faster | %.3f s | %.3f s | %.1f× faster |"
              % (n, ar, tr, tr / ar, ae, te, te / ae))
    print()


if __name__ == "__main__":
    main()
