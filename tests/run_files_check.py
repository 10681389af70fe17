#!/usr/bin/python3
"""Checks what `fashion_mnist --log_with tensorboard,csv` wrote on 2 processes, reading the event
file with the independent reader (tfevents_reader.py) and the CSV with Python's csv module:
the loss at every optimizer step, the accuracy after each epoch, both ranks' step-time breakdown,
the hyper-parameters (TensorBoard's hparams summary), and the same numbers in both files (TensorBoard keeps scalars in single precision).
Usage: run_files_check.py RUN_DIR EPOCHS"""
import csv
import glob
import json
import os
import struct
import subprocess
import sys

PHASES = ["data", "forward_backward", "all_reduce", "optimizer", "other", "step"]


def as_float32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def fail(message):
    sys.exit("run_files_check: " + message)


def main(run_dir, epochs):
    events = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    if len(events) != 1:
        fail("expected one event file in %s, found %s" % (run_dir, events))
    reader = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tfevents_reader.py")
    out = subprocess.run([reader, events[0]], capture_output=True, text=True)
    if out.returncode != 0:
        fail("the reader refused %s: %s" % (events[0], out.stderr))
    tb = {}  # (step, tag) -> value
    hparams = None
    for line in out.stdout.splitlines():
        record = json.loads(line)
        if "truncated_at" in record:
            fail("the event file of a finished run ends in a cut-off record: %s" % record)
        if "hparams" in record:
            hparams = record["hparams"]
        for tag, value in record.get("values", {}).items():
            tb[(record["step"], tag)] = value

    if hparams is None or hparams.get("world_size") != 2 or "lr" not in hparams:
        fail("the event file's hyper-parameters should hold lr and world_size 2; got %s" % hparams)

    with open(os.path.join(run_dir, "scalars.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    table = {(int(r["step"]), r["tag"]): float(r["value"]) for r in rows}

    loss_steps = sorted(step for step, tag in table if tag == "train/loss")
    if loss_steps != list(range(1, len(loss_steps) + 1)) or len(loss_steps) < 100:
        fail("train/loss should be logged at steps 1..N (N >= 100); got %d steps from %s" %
             (len(loss_steps), loss_steps[:3]))
    accuracy = sorted((step, v) for (step, tag), v in table.items() if tag == "eval/accuracy")
    if len(accuracy) != epochs or not all(50 < v <= 100 for _, v in accuracy):
        fail("eval/accuracy (percent) once per epoch, between 50 and 100; got %s" % accuracy)
    exchanges = sorted(step for step, tag in table if tag == "step_time/rank_1/step_ms")
    if not exchanges:
        fail("no step-time breakdown of rank 1 in the CSV")
    for step in exchanges:
        for rank in (0, 1):
            for phase in PHASES:
                tag = "step_time/rank_%d/%s_ms" % (rank, phase)
                if (step, tag) not in table:
                    fail("%s missing at step %d" % (tag, step))
                if not 0 <= table[(step, tag)] < 60000:
                    fail("%s = %r at step %d: not a plausible time" % (tag, table[(step, tag)], step))
        if table[(step, "step_time/rank_0/step_ms")] <= 0:
            fail("rank 0's step time at step %d is 0" % step)

    if set(tb) != set(table):
        only_tb = sorted(set(tb) - set(table))[:5]
        only_csv = sorted(set(table) - set(tb))[:5]
        fail("the event file and the CSV hold different scalars: only in the event file %s, only "
             "in the CSV %s" % (only_tb, only_csv))
    for key, value in table.items():
        if tb[key] != as_float32(value):
            fail("%s: the CSV says %r, the event file %r" % (key, value, tb[key]))
    print("run_files_check: %d scalars agree (%d loss steps, %d epochs, breakdown at steps %s)" %
          (len(table), len(loss_steps), len(accuracy), exchanges))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
