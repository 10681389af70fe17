"""Where a bench result came from: the commit, the date, the machine, and a digest of the code
it measured. Shared by bench/record, bench/gpt_compare.py and bench/render (one way to say it).

A result names its commit so a reader can check out what produced it; the digest lets the
renderer tell, without git (the GPU machine gets a copy of the tree, not the repository), whether
the code a result covers has changed since it ran.
"""
import datetime
import hashlib
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def git(*args):
    """git's stdout in the repository, None when git or the repository is missing."""
    try:
        out = subprocess.run(["git", "-C", ROOT] + list(args), capture_output=True, text=True)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def source():
    """The commit and whether tracked files differed from it (None: unknown, no repository).

    ACCELERANT_BENCH_SOURCE=COMMIT[+modified] stands in where the tree is a copy without .git
    (scripts/gpu-check pack writes it into .gpu/source)."""
    given = os.environ.get("ACCELERANT_BENCH_SOURCE")
    if given:
        commit, _, modified = given.partition("+")
        return {"commit": commit, "worktree_modified": modified == "modified"}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"),
            "worktree_modified": None if status is None else bool(status)}


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def machine():
    model, mem = None, None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = round(int(line.split()[1]) / 1024 / 1024, 1)
                    break
    except OSError:
        pass
    return {"cores": os.cpu_count(), "cpu_model": model, "memory_gib": mem,
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}


def digest(paths):
    """sha256 over the files under `paths` (relative to the repository root), names and
    contents in sorted order: the same tree gives the same digest with or without git."""
    h = hashlib.sha256()
    files = []
    for p in paths:
        full = os.path.join(ROOT, p)
        if os.path.isfile(full):
            files.append(p)
        for top, dirs, names in os.walk(full):
            dirs.sort()
            files += [os.path.relpath(os.path.join(top, n), ROOT) for n in names]
    for rel in sorted(set(files)):
        h.update(rel.encode() + b"\0")
        with open(os.path.join(ROOT, rel), "rb") as f:
            h.update(f.read())
        h.update(b"\0")
    return h.hexdigest()


def describe(result):
    """One line: the commit (short), date and machine of a result."""
    commit = (result.get("commit") or "unknown")[:7]
    if result.get("worktree_modified"):
        commit += " with uncommitted changes"
    date = (result.get("date") or "an unknown date").replace("T", " ")[:16]
    m = result.get("machine") or {}
    where = m.get("device") or ", ".join(
        x for x in [f"{m['cores']} cores" if m.get("cores") else None, m.get("cpu_model"),
                    f"{m['memory_gib']:g} GiB" if m.get("memory_gib") else None] if x)
    return f"commit {commit}, {date} UTC, {where or 'an unrecorded machine'}"
