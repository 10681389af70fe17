#!/usr/bin/python3
"""Prints the Markdown section of a bench/gpt_compare.py result file (JSON) on stdout.

Everything it prints comes from the file: the command, commit, date and machine, per process
count a table of both sides' measurements (medians over the completed runs, each run in brackets),
issue 33's goals as written in the file's config, judged as met or missed with their numbers,
and the val-loss curve of each side (medians per iteration). A time that was never reached is
printed as "not reached"; a figure a run did not produce as "—".

A file of `gpt_compare.py --preset gpu` (nanoGPT's GPU configuration, 1 process, on the GPU
named in the file) gets a heading saying so, no time to a target val loss (it has none), and
its one goal judged: Accelerant's tokens/s >= 1.3x the twin's (eager) on the same GPU; a dry
run with the twin on the CPU (GPT_COMPARE_DEVICE=cpu) is rendered but not judged.

Usage: render_gpt.py [RESULT.json]    (default bench/results/gpt_cpu.json)
"""
import json
import os
import sys

NAMES = {"accelerant": "Accelerant", "pytorch": "PyTorch DDP"}
GPU_NAMES = {"accelerant": "Accelerant", "pytorch": "PyTorch (eager)"}  # --preset gpu


def fmt(value, spec, none="—"):
    return none if value is None else spec % value


def runs_of(result, side, processes):
    return [r for r in result["runs"] if r["side"] == side and r["processes"] == processes]


def summary_of(result, side, processes):
    for s in result["summary"]:
        if s["side"] == side and s["processes"] == processes:
            return s
    return {}


def with_runs(median, runs, key, spec, none="—"):
    """The median, then each run's value in brackets (in run order)."""
    each = ", ".join(fmt(r.get(key), spec, none) if r["complete"] else "failed" for r in runs)
    if not any(r["complete"] for r in runs):  # no median at all, not a time never reached
        return "— (%s)" % each if runs else "—"
    return "%s (%s)" % (fmt(median, spec, none), each)


def verdict(ok):
    return "**met**" if ok else "**missed**"


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join("bench", "results", "gpt_cpu.json")
    if len(sys.argv) > 2 or path in ("-h", "--help"):
        raise SystemExit(__doc__)
    with open(path) as f:
        result = json.load(f)
    config, m = result["config"], result["machine"]
    if config.get("preset", "cpu") == "gpu":
        return main_gpu(result)
    target = config["target_val_loss"]
    goals = config["goals"]

    dtype = config.get("dtype", "float32")
    print("## GPT on tiny Shakespeare against a PyTorch twin (issue 33)%s\n"
          % ("" if dtype == "float32" else ", %s autocast on both sides" % dtype))
    print("Command: `%s`  " % result["command"])
    print("Commit: `%s`%s  " % (result["commit"], " (with uncommitted changes to tracked files)"
                                if result.get("worktree_modified") else ""))
    print("Date: %s  " % result["date"])
    print("Machine: %s cores, %s, %s GiB; load average at the start %s%s  "
          % (m["cores"], m["cpu_model"], m["memory_gib"],
             " / ".join("%.2f" % x for x in m.get("load_average_at_start", [])),
             "; " + ", ".join("%s=%s" % kv for kv in sorted(m["openblas_env"].items()))
             if m.get("openblas_env") else ""))
    print("Python side: Debian's python3-torch %s\n" % config.get("python_torch"))
    print("nanoGPT's shakespeare_char CPU configuration on `%s`: %d iterations, global batch %d "
          "windows of %d characters (%s per process on %s processes), gradient accumulation %d, "
          "evaluation every %d iterations over %d random batches per split; %d round%s per "
          "process count, the side going first alternating. Seconds from just before the launch "
          "to the line as it arrives. Medians over the completed runs, each run in brackets in "
          "run order. Tokens/s: tokens trained between the evaluation at iteration %d and the "
          "last one, over the seconds between those two lines.\n"
          % (config["input"], config["max_iters"], config["global_batch"], config["block_size"],
             "/".join(str(v) for v in config["batch_size_per_process"].values()),
             "/".join(str(p) for p in config["processes"]),
             config["gradient_accumulation_steps"], config["eval_interval"],
             config["eval_iters"], config["rounds"], "" if config["rounds"] == 1 else "s",
             config["eval_interval"]))
    for p in config["processes"]:
        for side in NAMES:
            print("- %s, %d process%s: `%s`" % (NAMES[side], p, "" if p == 1 else "es",
                                               config["commands"][side][str(p)]))
    print()

    for p in config["processes"]:
        a_runs, b_runs = runs_of(result, "accelerant", p), runs_of(result, "pytorch", p)
        a, b = summary_of(result, "accelerant", p), summary_of(result, "pytorch", p)
        ratio = summary_of(result, "ratio accelerant/pytorch", p)
        print("### %d process%s\n" % (p, "" if p == 1 else "es"))
        print("| measure | Accelerant | PyTorch DDP | Accelerant / PyTorch |")
        print("|---|---|---|---:|")
        print("| runs completed | %s of %s | %s of %s | |"
              % (a.get("complete_runs"), a.get("runs"), b.get("complete_runs"), b.get("runs")))
        print("| threads per process (as reported) | %s | %s | |"
              % ("/".join(sorted({str(r["threads"]) for r in a_runs})) or "—",
                 "/".join(sorted({str(r["threads"]) for r in b_runs})) or "—"))
        print("| val loss at iteration %d | %s | %s | |"
              % (config["max_iters"], with_runs(a.get("final_val_loss"), a_runs,
                                                 "final_val_loss", "%.4f"),
                 with_runs(b.get("final_val_loss"), b_runs, "final_val_loss", "%.4f")))
        print("| val loss over the whole validation split | %s | %s | |"
              % (with_runs(a.get("whole_split_val_loss"), a_runs, "whole_split_val_loss", "%.4f"),
                 with_runs(b.get("whole_split_val_loss"), b_runs, "whole_split_val_loss",
                           "%.4f")))
        print("| s to val loss ≤ %s | %s | %s | %s |"
              % (target, with_runs(a.get("seconds_to_target"), a_runs, "seconds_to_target",
                                   "%.1f", "not reached"),
                 with_runs(b.get("seconds_to_target"), b_runs, "seconds_to_target", "%.1f",
                           "not reached"),
                 fmt(ratio.get("seconds_to_target"), "%.2f×")))
        print("| tokens/s | %s | %s | %s |"
              % (with_runs(a.get("tokens_per_s"), a_runs, "tokens_per_s", "%.0f"),
                 with_runs(b.get("tokens_per_s"), b_runs, "tokens_per_s", "%.0f"),
                 fmt(ratio.get("tokens_per_s"), "%.2f×")))
        print("| s to the first iteration | %s | %s | |"
              % (with_runs(a.get("ready_s"), a_runs, "ready_s", "%.1f"),
                 with_runs(b.get("ready_s"), b_runs, "ready_s", "%.1f")))
        print("| s to exit | %s | %s | %s |"
              % (with_runs(a.get("wall_s"), a_runs, "wall_s", "%.1f"),
                 with_runs(b.get("wall_s"), b_runs, "wall_s", "%.1f"),
                 fmt(ratio.get("wall_s"), "%.2f×")))
        print()
        failed = [r for r in a_runs + b_runs if not r["complete"]]
        for r in failed:
            print("%s, round %d: exit status %s%s%s; its last lines:\n\n```\n%s\n```\n"
                  % (NAMES[r["side"]], r["round"], r["exit_status"],
                     ", timed out" if r["timed_out"] else "",
                     ", missing " + ", ".join(r["missing"]) if r["missing"] else "",
                     "\n".join(r.get("output_tail", []))))

    print("### Goals\n")
    one = summary_of(result, "accelerant", 1)
    two = summary_of(result, "accelerant", 2)
    if 1 in config["processes"]:
        val = one.get("final_val_loss")
        if config["max_iters"] != goals["iteration"]:
            print("- Accelerant's val loss ≤ %s at iteration %d on 1 process: not judged (these "
                  "runs stop at iteration %d; val loss %s there)"
                  % (goals["val_loss_max"], goals["iteration"], config["max_iters"],
                     fmt(val, "%.4f")))
        else:
            print("- Accelerant's val loss ≤ %s at iteration %d on 1 process: %s (%s)"
                  % (goals["val_loss_max"], goals["iteration"],
                     verdict(val is not None and val <= goals["val_loss_max"]), fmt(val, "%.4f")))
    if 1 in config["processes"] and 2 in config["processes"]:
        v1, v2 = one.get("final_val_loss"), two.get("final_val_loss")
        diff = None if v1 is None or v2 is None else abs(v2 - v1)
        w1, w2 = one.get("whole_split_val_loss"), two.get("whole_split_val_loss")
        print("- Accelerant's val loss on 2 processes within %s of 1 process's: %s (%s against "
              "%s, difference %s; over the whole validation split %s against %s)"
              % (goals["processes_val_loss_within"],
                 verdict(diff is not None and diff <= goals["processes_val_loss_within"]),
                 fmt(v2, "%.4f"), fmt(v1, "%.4f"), fmt(diff, "%.4f"), fmt(w2, "%.4f"),
                 fmt(w1, "%.4f")))
    for p in config["processes"]:
        limit = goals["time_ratio_max"].get(str(p))
        if limit is None:
            continue
        a = summary_of(result, "accelerant", p)
        b = summary_of(result, "pytorch", p)
        r = summary_of(result, "ratio accelerant/pytorch", p).get("seconds_to_target")
        print("- time to val loss ≤ %s on %d process%s ≤ %s× the twin's: %s (%s; Accelerant %s, "
              "PyTorch %s)"
              % (target, p, "" if p == 1 else "es", limit,
                 verdict(r is not None and r <= limit), fmt(r, "%.2f×", "no ratio"),
                 fmt(a.get("seconds_to_target"), "%.1f s", "not reached"),
                 fmt(b.get("seconds_to_target"), "%.1f s", "not reached")))
        if r is None:
            # Not the goal's measure, said so: the time to the last evaluation, where both sides
            # stand near the target, so that the speed is still compared.
            last_a = (a.get("curve") or [None])[-1]
            last_b = (b.get("curve") or [None])[-1]
            if last_a and last_b and last_a[0] == last_b[0] and last_b[3]:
                print("  - in its place (not the goal's measure): seconds to the evaluation at "
                      "iteration %d, Accelerant %.1f s (val loss %.4f), PyTorch %.1f s (val loss "
                      "%.4f): %.2f×"
                      % (last_a[0], last_a[3], last_a[2], last_b[3], last_b[2],
                         last_a[3] / last_b[3]))
    print()

    print("### Val-loss curves (medians over the completed runs)\n")
    for p in config["processes"]:
        curves = {side: {c[0]: c for c in summary_of(result, side, p).get("curve", [])}
                  for side in NAMES}
        iterations = sorted(set(curves["accelerant"]) | set(curves["pytorch"]))
        print("%d process%s:\n" % (p, "" if p == 1 else "es"))
        print("| iteration | Accelerant val loss | Accelerant s | PyTorch val loss | PyTorch s |")
        print("|---:|---:|---:|---:|---:|")
        for it in iterations:
            a, b = curves["accelerant"].get(it), curves["pytorch"].get(it)
            print("| %d | %s | %s | %s | %s |"
                  % (it, fmt(a and a[2], "%.4f"), fmt(a and a[3], "%.1f"),
                     fmt(b and b[2], "%.4f"), fmt(b and b[3], "%.1f")))
        print()


def main_gpu(result):
    """A `--preset gpu` file: 1 process on the GPU, tokens/s against the twin's."""
    config, m = result["config"], result["machine"]
    goals, names = config["goals"], GPU_NAMES
    on_gpu = config.get("twin_device") == "cuda"
    where = (m.get("gpu") or "an unnamed GPU") if on_gpu else \
        "the CPU (a dry run: GPT_COMPARE_DEVICE=%s)" % config.get("twin_device")
    print("## GPT on tiny Shakespeare against a PyTorch twin (issue 33): nanoGPT's GPU "
          "configuration on %s, %s on both sides\n"
          % (where, "float32" if config["dtype"] == "float32"
             else "%s autocast" % config["dtype"]))
    print("Command: `%s`  " % result["command"])
    print("Commit: `%s`%s  " % (result["commit"], " (with uncommitted changes to tracked files)"
                                if result.get("worktree_modified") else ""))
    print("Date: %s  " % result["date"])
    print("Machine: %s; %s cores, %s, %s GiB; load average at the start %s  "
          % (m.get("gpu") or "no GPU", m["cores"], m["cpu_model"], m["memory_gib"],
             " / ".join("%.2f" % x for x in m.get("load_average_at_start", []))))
    print("Python side: torch %s (`%s`)\n" % (config.get("python_torch"), config.get("python")))
    model = config.get("model", {})
    print("nanoGPT's config/train_shakespeare_char.py on `%s`: %s; %d iterations, batch %d "
          "windows of %d characters on 1 process, gradient accumulation %d, evaluation every %d "
          "iterations over %d random batches per split; %d round%s, the side going first "
          "alternating. Accelerant in graph mode (`%s`: the step captured as a CUDA graph and "
          "replayed; its fused AdamW), the twin eager (no torch.compile; torch's AdamW). "
          "Seconds from just before the launch to the line as it arrives. Medians over the "
          "completed runs, each run in brackets in run order. Tokens/s: tokens trained between "
          "the evaluation at iteration %d and the last one, over the seconds between those two "
          "lines (the evaluations in between, and Accelerant's checkpoints, included).\n"
          % (config["input"], ", ".join("%s %s" % kv for kv in model.items()),
             config["max_iters"], config["global_batch"], config["block_size"],
             config["gradient_accumulation_steps"], config["eval_interval"],
             config["eval_iters"], config["rounds"], "" if config["rounds"] == 1 else "s",
             config.get("accelerant_flags", ""), config["eval_interval"]))
    for side in names:
        print("- %s: `%s`" % (names[side], config["commands"][side]["1"]))
    print()

    a_runs, b_runs = runs_of(result, "accelerant", 1), runs_of(result, "pytorch", 1)
    a, b = summary_of(result, "accelerant", 1), summary_of(result, "pytorch", 1)
    ratio = summary_of(result, "ratio accelerant/pytorch", 1)
    print("| measure | Accelerant | PyTorch (eager) | Accelerant / PyTorch |")
    print("|---|---|---|---:|")
    print("| runs completed | %s of %s | %s of %s | |"
          % (a.get("complete_runs"), a.get("runs"), b.get("complete_runs"), b.get("runs")))
    print("| tokens/s | %s | %s | %s |"
          % (with_runs(a.get("tokens_per_s"), a_runs, "tokens_per_s", "%.0f"),
             with_runs(b.get("tokens_per_s"), b_runs, "tokens_per_s", "%.0f"),
             fmt(ratio.get("tokens_per_s"), "%.2f×")))
    print("| val loss at iteration %d | %s | %s | |"
          % (config["max_iters"], with_runs(a.get("final_val_loss"), a_runs, "final_val_loss",
                                             "%.4f"),
             with_runs(b.get("final_val_loss"), b_runs, "final_val_loss", "%.4f")))
    print("| val loss over the whole validation split | %s | %s | |"
          % (with_runs(a.get("whole_split_val_loss"), a_runs, "whole_split_val_loss", "%.4f"),
             with_runs(b.get("whole_split_val_loss"), b_runs, "whole_split_val_loss", "%.4f")))
    print("| s to the first iteration | %s | %s | |"
          % (with_runs(a.get("ready_s"), a_runs, "ready_s", "%.1f"),
             with_runs(b.get("ready_s"), b_runs, "ready_s", "%.1f")))
    print("| s to exit | %s | %s | %s |"
          % (with_runs(a.get("wall_s"), a_runs, "wall_s", "%.1f"),
             with_runs(b.get("wall_s"), b_runs, "wall_s", "%.1f"),
             fmt(ratio.get("wall_s"), "%.2f×")))
    print()
    for r in [r for r in a_runs + b_runs if not r["complete"]]:
        print("%s, round %d: exit status %s%s%s; its last lines:\n\n```\n%s\n```\n"
              % (names[r["side"]], r["round"], r["exit_status"],
                 ", timed out" if r["timed_out"] else "",
                 ", missing " + ", ".join(r["missing"]) if r["missing"] else "",
                 "\n".join(r.get("output_tail", []))))

    print("### Goal\n")
    limit, r = goals["tokens_per_s_ratio_min"], ratio.get("tokens_per_s")
    print("- Accelerant's tokens/s ≥ %s× the twin's (eager) on the same GPU: %s (%s; Accelerant "
          "%s, PyTorch %s)"
          % (limit, verdict(r is not None and r >= limit) if on_gpu
             else "not judged (a dry run on the CPU)", fmt(r, "%.2f×", "no ratio"),
             fmt(a.get("tokens_per_s"), "%.0f tokens/s"),
             fmt(b.get("tokens_per_s"), "%.0f tokens/s")))
    print()

    print("### Val-loss curves (medians over the completed runs)\n")
    curves = {side: {c[0]: c for c in summary_of(result, side, 1).get("curve", [])}
              for side in names}
    print("| iteration | Accelerant val loss | Accelerant s | PyTorch val loss | PyTorch s |")
    print("|---:|---:|---:|---:|---:|")
    for it in sorted(set(curves["accelerant"]) | set(curves["pytorch"])):
        a, b = curves["accelerant"].get(it), curves["pytorch"].get(it)
        print("| %d | %s | %s | %s | %s |"
              % (it, fmt(a and a[2], "%.4f"), fmt(a and a[3], "%.1f"),
                 fmt(b and b[2], "%.4f"), fmt(b and b[3], "%.1f")))
    print()


if __name__ == "__main__":
    main()
