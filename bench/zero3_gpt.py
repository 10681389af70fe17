#!/usr/bin/env python3
"""ZeRO stage 3 against stage 2 on the small GPT (issue 36's speed goal): prints a Markdown section.

The GPT example (examples/gpt, nanoGPT's CPU configuration) trains tiny Shakespeare on 2 forked
processes at --zero_stage 2 and 3, each for a short and a long run; the time of one iteration is
(long run's wall time - short run's) / (difference in iterations), so that start-up, the
evaluations at the start and the end and the final save cancel out. The stages alternate within
each round, the one that goes first rotating. Stage 3's runs print what the blocks waited for their
parameter all-gathers (the part the prefetch did not hide); the long runs' share is reported.

Usage: bench/zero3_gpt.py BUILD_DIR --input tinyshakespeare.txt [--rounds 3]
"""
import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

GOAL = 1.15  # a stage-3 iteration within 1.15 x a stage-2 iteration


def run(build, corpus, stage, iters, out_dir):
    shutil.rmtree(out_dir, ignore_errors=True)
    command = [f"{build}/bin/gpt", "--input", corpus, "-n", "2", "--batch_size", "6",
               "--max_iters", str(iters), "--eval_interval", "100000", "--zero_stage", str(stage),
               "--num_samples", "0", "--out_dir", out_dir]
    start = time.monotonic()
    done = subprocess.run(command, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=600)
    seconds = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(f"zero3_gpt: {' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    waited = None
    found = re.search(r"ZeRO-3: waited ([0-9.]+) s for parameter all-gathers in ([0-9.]+) s", done.stdout)
    if found:
        waited = float(found.group(1)) / float(found.group(2))
    return seconds, waited


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build")
    parser.add_argument("--input", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--short", type=int, default=20)
    parser.add_argument("--long", type=int, default=220)
    a = parser.parse_args()
    per_iter = {2: [], 3: []}
    wait_share = []
    out_dir = tempfile.mkdtemp(prefix="zero3_gpt.")
    try:
        for r in range(a.rounds):
            for stage in ([2, 3] if r % 2 == 0 else [3, 2]):
                short, _ = run(a.build, a.input, stage, a.short, out_dir)
                long, waited = run(a.build, a.input, stage, a.long, out_dir)
                per_iter[stage].append((long - short) / (a.long - a.short) * 1000)
                if stage == 3 and waited is not None:
                    wait_share.append(waited * 100)
                print(f"zero3_gpt: round {r + 1}, stage {stage}: {per_iter[stage][-1]:.1f} ms",
                      file=sys.stderr)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    two, three = statistics.median(per_iter[2]), statistics.median(per_iter[3])
    ratio = three / two
    print("| stage | ms per iteration (median of rounds) | each round (ms) | / stage 2 | goal ≤ "
          f"{GOAL} × stage 2 | waiting on all-gathers (% of training, stage 3) |")
    print("|---:|---:|---|---:|---|---:|")
    print(f"| 2 | {two:.1f} | {', '.join(f'{v:.1f}' for v in per_iter[2])} | 1.00 | | - |")
    verdict = "met" if ratio <= GOAL else "**missed**"
    share = f"{statistics.median(wait_share):.1f}" if wait_share else "-"
    print(f"| 3 | {three:.1f} | {', '.join(f'{v:.1f}' for v in per_iter[3])} | {ratio:.2f} | "
          f"{verdict} | {share} |")


if __name__ == "__main__":
    main()
