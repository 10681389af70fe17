#!/usr/bin/python3
"""Issue 23's done-when for the example: the final eval/accuracy of two runs' scalars.csv (the
CSV tracker's tag,value rows) differ by at most TOLERANCE points.

    same_accuracy.py RUN_A/scalars.csv RUN_B/scalars.csv TOLERANCE
"""
import csv
import sys


def final_accuracy(path):
    last = None
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["tag"] == "eval/accuracy":
                last = (int(row["step"]), float(row["value"]))
    if last is None:
        sys.exit(f"{path}: no eval/accuracy row (was the run logged with --log_with csv?)")
    return last


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    (step_a, a), (step_b, b) = final_accuracy(sys.argv[1]), final_accuracy(sys.argv[2])
    tolerance = float(sys.argv[3])
    print(f"{sys.argv[1]}: {a:.2f}% at step {step_a}")
    print(f"{sys.argv[2]}: {b:.2f}% at step {step_b}")
    if step_a != step_b:
        sys.exit(f"the runs ended at different steps ({step_a} and {step_b}): not comparable")
    if abs(a - b) > tolerance:
        sys.exit(f"accuracies differ by {abs(a - b):.2f} points, more than {tolerance}")
    print(f"same accuracy within {tolerance} points ({abs(a - b):.2f})")


main()
