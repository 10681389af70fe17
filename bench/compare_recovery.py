#!/usr/bin/python3
"""What one worker's failure costs (issue 37), side by side in one run: the time from the worker's
SIGKILL to the next completed step, and the steps done again, for
  - accelerant launch --recovery replace_failed_worker  (in place: only the failed worker is
    started again; the others keep their state and redo the step that failed)
  - accelerant launch --recovery restart_group            (every worker restarts and resumes from
    the last checkpoint, as torchrun does)
  - torchrun --max_restarts 1 with the PyTorch twin      (bench/recovery_twin.py)
each on 2 processes, the same MLP, batch, optimizer and checkpoint interval (bench/recovery.cpp),
run RUNS times each, interleaved. Both clocks are CLOCK_MONOTONIC. Prints a Markdown section.
Usage: compare_recovery.py BUILD_DIR [RUNS]
"""
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
GOAL_SECONDS = 2.0  # issue 37: SIGKILL -> next completed step, in place
GOAL_STEPS = 1      # ... and steps done again
STEPS, KILL_AT, EVERY, PROCESSES = 40, 17, 10, 2


def measure(cmd, env=None):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    text = out.stdout + out.stderr
    kills = [float(t) for t in re.findall(r"KILL (\d+\.\d+)", text)]
    steps = [(int(n), float(t)) for n, t in re.findall(r"STEP (\d+) (\d+\.\d+)", text)]
    if out.returncode != 0 or len(kills) != 1 or not steps or steps[-1][0] != STEPS:
        raise SystemExit("%s failed (exit %d):\n%s" % (" ".join(cmd), out.returncode, text[-3000:]))
    kill = kills[0]
    # The step that failed, completed at last: after a restart, the steps since the checkpoint
    # come first (a restart's first step after the kill is one of those, not progress).
    seconds = [t for n, t in steps if t > kill and n == KILL_AT + 1][0] - kill
    redone = len(steps) - STEPS  # steps printed twice: computed again
    return seconds, redone + 1   # ... and the step that failed, done again in every mode


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    cli = os.path.join(build, "bin", "accelerant")
    worker = os.path.join(build, "bin", "bench_recovery")
    twin = os.path.join(HERE, "recovery_twin.py")
    flags = ["--steps", str(STEPS), "--kill_at", str(KILL_AT), "--checkpoint_every", str(EVERY)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    modes = {
        "accelerant, in place (`--recovery replace_failed_worker`)":
            lambda d: [cli, "launch", "-n", str(PROCESSES), "--max_restarts", "1",
                       "--threads_per_process", "1", "--recovery", "replace_failed_worker",
                       worker] + flags + ["--project", d],
        "accelerant, the group restarted (`--recovery restart_group`)":
            lambda d: [cli, "launch", "-n", str(PROCESSES), "--max_restarts", "1",
                       "--threads_per_process", "1", "--recovery", "restart_group",
                       worker] + flags + ["--project", d],
        "torchrun --max_restarts 1, PyTorch twin":
            lambda d: ["/usr/bin/python3", "-m", "torch.distributed.run", "--standalone",
                       "--nproc_per_node", str(PROCESSES), "--max_restarts", "1",
                       "--redirects", "1", "--tee", "1", twin] + flags + ["--project", d],
    }
    results = {name: [] for name in modes}
    for _ in range(runs):
        for name, command in modes.items():
            d = tempfile.mkdtemp(prefix="bench-recovery-")
            try:
                results[name].append(measure(command(d), env))
            finally:
                shutil.rmtree(d, ignore_errors=True)
    torchrun = statistics.median(s for s, _ in results["torchrun --max_restarts 1, PyTorch twin"])
    print("## Recovery from a worker's failure (issue 37)\n")
    print("%d processes, an MLP (784-512-512-10, AdamW, batch 64 per process) for %d steps with a "
          "checkpoint every %d; rank 1 is SIGKILLed after %d steps, between a forward and its "
          "backward. Time from the SIGKILL until the step that failed is complete, which after a "
          "restart means every step since the checkpoint computed again (median of %d runs, "
          "interleaved), and the steps computed again (the failed one included).\n"
          % (PROCESSES, STEPS, EVERY, KILL_AT, runs))
    print("| recovery | SIGKILL -> the failed step done (s) | runs (s) | steps done again | vs torchrun |")
    print("|---|---|---|---|---|")
    for name, rows in results.items():
        seconds = statistics.median(s for s, _ in rows)
        print("| %s | %.2f | %s | %d | %.2f x |" % (
            name, seconds, ", ".join("%.2f" % s for s, _ in rows), max(n for _, n in rows),
            seconds / torchrun))
    in_place = results["accelerant, in place (`--recovery replace_failed_worker`)"]
    seconds = statistics.median(s for s, _ in in_place)
    redone = max(n for _, n in in_place)
    print("\nGoal (issue 37): in place, at most %.0f s from the SIGKILL to the next completed step "
          "and at most %d step done again: **%s** (%.2f s, %d step%s)."
          % (GOAL_SECONDS, GOAL_STEPS,
             "met" if seconds <= GOAL_SECONDS and redone <= GOAL_STEPS else "missed", seconds,
             redone, "" if redone == 1 else "s"))


if __name__ == "__main__":
    main()
