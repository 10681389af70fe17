#!/usr/bin/python3
"""Writes the result file of one `scripts/gpu-check run` (called by it, on the GPU machine):
OUT/gpu-DATE-DEVICE.json with the commit (from .gpu/source, written by `gpu-check pack`), the
device and the torch/CUDA versions, each stage passed or failed with the counts its log gives,
the graph-mode bench's rows and the GPT comparison, and the digest of the files the run covers
(bench/provenance.py), by which bench/render tells a current run from one older than the code.
Copy it into bench/results/ and run bench/render; commit both.

Usage: gpu_result.py OUT    (OUT holds versions.txt, stages.tsv and each stage's NAME.log)
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402

# What a GPU run exercises: the library, its build, the tests and benches gpu-check runs.
COVERS = ["CMakeLists.txt", "cmake", "include", "src", "tests/gpu_test.cpp",
          "tests/graph_replay_test.cpp", "tests/fused_optimizer_test.cpp",
          "tests/graph_step_test.cpp", "tests/activation_checkpoint_test.cpp",
          "tests/profile_test.cpp", "bench/graph_step.cpp", "bench/gpt_compare.py",
          "bench/gpt_twin.py", "examples/gpt"]


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def summary(log):
    """gtest's counts when the log has them, else its last line."""
    counts = []
    for word, pattern in [("passed", r"\[  PASSED  \] (\d+) tests?"),
                          ("failed", r"\[  FAILED  \] (\d+) tests?, listed"),
                          ("skipped", r"\[  SKIPPED \] (\d+) tests?, listed")]:
        m = re.search(pattern, log)
        if m:
            counts.append(f"{m.group(1)} {word}")
    if counts:
        return ", ".join(counts)
    lines = [l.strip() for l in log.splitlines() if l.strip()]
    return (lines[-1][:160].replace("|", "/")) if lines else "no output"


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    out = sys.argv[1]
    versions = read(os.path.join(out, "versions.txt")).strip()
    m = re.search(r"gpu (.+)$", versions.splitlines()[0] if versions else "")
    device = m.group(1).strip() if m and m.group(1).strip() != "None" else "no GPU seen"
    stages = []
    for line in read(os.path.join(out, "stages.tsv")).splitlines():
        name, _, status = line.partition("\t")
        stages.append({"name": name, "passed": status == "passed",
                       "summary": summary(read(os.path.join(out, name + ".log")))})
    bench = []
    for l in read(os.path.join(out, "bench_graph_step.log")).splitlines():
        if l.startswith("device:"):
            bench += ["", l, ""]  # a line of its own above each table
        elif l.startswith("|"):
            bench.append(l)
    parts = []
    if bench:
        parts.append("`bench_graph_step --steps 300` (`env ACCELERANT_METRICS=1`):\n" +
                     "\n".join(bench))
    gpt = read(os.path.join(out, "gpt_gpu.md")).strip()
    if gpt:  # its headings one level down, under the run's own
        parts.append(re.sub(r"^(#+) ", r"\1## ", gpt, flags=re.M))
    date = provenance.now()
    result = {"name": None, "command": "scripts/gpu-check run", **provenance.source(),
              "date": date, "machine": {**provenance.machine(), "device": device,
                                        "versions": versions},
              "covers": COVERS, "covers_digest": provenance.digest(COVERS),
              "stages": stages, "output": "\n\n".join(parts)}
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")[:40]
    name = f"gpu-{date[:16].replace(':', '')}-{slug}"
    result["name"] = name
    path = os.path.join(out, name + ".json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"gpu-check: wrote {path}; copy it into bench/results/ and run bench/render")


if __name__ == "__main__":
    main()
