#!/usr/bin/python3
"""How Accelerant's step time grows with model size and with world size, and how much of the
gradient all-reduce the bucketed reducer leaves exposed after backward.

An MLP (784 -> W -> W -> 10) of three widths on 1, 2 and 4 processes x 1 thread (4 processes
oversubscribe this machine's 2 cores), batch 64 per process, rounds interleaved. Per cell: the
median step time, the samples/s of all processes, the efficiency against N independent copies of
the 1-process run (N x its samples/s: what perfect scaling would give), and the reducer's exposed
wait (the median time backward's end spent waiting for all-reduces that computation did not hide).
Prints a Markdown section on stdout; progress on stderr.

Usage: scaling.py BUILD_DIR [ROUNDS]    (ROUNDS defaults to 2)
"""
import os
import re
import shlex
import statistics
import subprocess
import sys

WIDTHS = (256, 1024, 2048)
WORLDS = (1, 2, 4)
STEPS, WARMUP = 60, 10
TIMEOUT_S = 600
RESULT_RE = re.compile(r"RESULT samples_per_sec=([0-9.eE+-]+) step_ms_median=([0-9.eE+-]+) world=\d+ "
                       r"exposed_wait_ms_median=([0-9.eE+-]+)")


def command(build, width, processes):
    return [os.path.join(build, "bin", "bench_training"), "--model", "mlp", "--mlp_width", str(width),
            "--batch", "64", "--steps", str(STEPS), "--warmup", str(WARMUP), "--threads", "1",
            "--processes", str(processes)]


def measure(cmd):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    found = RESULT_RE.findall(out.stdout)
    if out.returncode != 0 or len(found) != 1:
        raise SystemExit("benchmark command failed (exit code %d):\n  %s\n--- output tail ---\n%s"
                         % (out.returncode, shlex.join(cmd), (out.stdout + out.stderr)[-4000:]))
    return tuple(float(x) for x in found[0])  # samples/s, step ms, exposed ms


def parameters(width):
    return 784 * width + width + width * width + width + width * 10 + 10


def main():
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    build = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) == 3 else 2
    runs = {}
    for r in range(rounds):
        for width in WIDTHS:
            for world in (WORLDS if r % 2 == 0 else tuple(reversed(WORLDS))):
                result = measure(command(build, width, world))
                runs.setdefault((width, world), []).append(result)
                print("round %d/%d  width %d  %d process(es): %.1f samples/s, step %.2f ms, exposed %.2f ms"
                      % (r + 1, rounds, width, world, *result), file=sys.stderr, flush=True)

    def median(width, world, index):
        return statistics.median(run[index] for run in runs[(width, world)])

    print("### e. Step time vs model size and world size; the reducer's exposed all-reduce\n")
    print("Command: `bench/scaling.py %s %d`. Median of %d interleaved rounds of `%s` for W in %s "
          "and N in %s (OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=1). Efficiency = samples/s of N "
          "processes / (N × samples/s of 1 process); 4 processes share 2 cores, so 0.5 is their "
          "ceiling. Exposed = the median time backward's end waited for all-reduces (rank 0).\n"
          % (build, rounds, rounds, shlex.join(command(build, "W", "N")), list(WIDTHS), list(WORLDS)))
    print("| MLP width | parameters | processes | step ms | samples/s | efficiency | exposed all-reduce ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for width in WIDTHS:
        single = median(width, 1, 0)
        for world in WORLDS:
            rate = median(width, world, 0)
            print("| %d | %.2f M | %d | %.2f | %.0f | %.2f | %.2f |"
                  % (width, parameters(width) / 1e6, world, median(width, world, 1), rate,
                     rate / (world * single), median(width, world, 2)))
    print()


if __name__ == "__main__":
    main()
