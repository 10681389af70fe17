#!/usr/bin/env python3
"""The report test's inputs and its independent checks (Python's standard library only).

  report_fixtures.py run RUN_DIR          scalars.jsonl of a resumed two-rank run
  report_fixtures.py checkpoint DIR STEP  a checkpoint folder as save_state lays it out
  report_fixtures.py dom DOM_FILE         the rendered page's elements (exit 1 naming what is wrong)
  report_fixtures.py png PNG_FILE         the screenshot is a real picture, not a blank page
"""
import html.parser
import json
import math
import os
import struct
import sys
import zlib


def write_run(run_dir):
    """train/loss at every step, samples/s, eval/accuracy per epoch, step times of 2 ranks every
    50 steps (rank 1 30 % slower), then a resume from step 150 that logs 151..200 again: the
    report must keep the later values (train/loss 0.05 at step 200)."""
    os.makedirs(run_dir, exist_ok=True)
    lines = [{"config": {"lr": 0.001, "batch_size": 64, "optimizer": "adam <&> \"quoted\""}}]

    def steps(first, last, loss_at_end):
        for step in range(first, last + 1):
            values = {"train/loss": 2.3 * math.exp(-step / 60) + 0.1,
                      "train/samples_per_second": 5000 + 300 * math.sin(step / 9)}
            if step == last:
                values["train/loss"] = loss_at_end
            if step % 100 == 0:
                values["eval/accuracy"] = 0.70 + step / 2000
                values["epoch"] = step // 100
            if step % 50 == 0:
                for rank, slower in ((0, 1.0), (1, 1.3)):
                    phases = {"data": 4.0, "forward_backward": 60.0, "all_reduce": 20.0,
                              "optimizer": 10.0, "other": 6.0}
                    for phase, ms in phases.items():
                        values[f"step_time/rank_{rank}/{phase}_ms"] = ms * slower
                    values[f"step_time/rank_{rank}/step_ms"] = 100.0 * slower
                values["step_time/straggler"] = 1  # the library's verdict, as it logs it
            lines.append({"step": step, "values": values})

    steps(1, 200, 0.5)
    lines.append({"config": {"lr": 0.0005, "batch_size": 64, "optimizer": "adam <&> \"quoted\""}})
    steps(151, 200, 0.05)
    with open(os.path.join(run_dir, "scalars.jsonl"), "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")


def write_checkpoint(path, step):
    """The layout of src/checkpoint (checkpoint_layout.h, manifest.cpp): model and optimizer
    files, state.json, a folder per rank, and manifest.json last, listing every other file with
    its size and CRC-32 so that `accelerant checkpoint verify` accepts it."""
    files = {"model_0.pt": os.urandom(40000), "optimizer_0.pt": os.urandom(80000),
             "rank_0/rng.pt": os.urandom(700), "rank_1/rng.pt": os.urandom(700),
             "state.json": json.dumps({"optimizer_steps": step, "micro_steps": step,
                                       "schedulers": [], "data_loaders": []}).encode()}
    for name, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(path, name)), exist_ok=True)
        with open(os.path.join(path, name), "wb") as f:
            f.write(data)
    manifest = {"format": "accelerant-checkpoint", "format_version": 1,
                "accelerant_version": "0.2.0", "libtorch_version": "1.13.1",
                "created": "2026-12-04T10:%02d:00Z" % (step // 10), "world_size": 2,
                "step": step, "epoch": step // 100,
                "contents": {"models": 1, "optimizers": 1, "schedulers": 0, "data_loaders": 0,
                             "custom_objects": 0, "scaler": False},
                "files": [{"path": n, "size": len(d), "crc32": "%08x" % zlib.crc32(d)}
                          for n, d in sorted(files.items())]}
    with open(os.path.join(path, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)


class Dom(html.parser.HTMLParser):
    """Every element with its attributes and the text inside it."""

    def __init__(self):
        super().__init__()
        self.elements, self.open = [], []

    def handle_starttag(self, tag, attrs):
        element = {"tag": tag, "attrs": dict(attrs), "text": "", "parents": list(self.open)}
        self.elements.append(element)
        if tag not in ("meta", "br", "img", "input", "link", "hr"):
            self.open.append(element)

    def handle_startendtag(self, tag, attrs):
        self.elements.append({"tag": tag, "attrs": dict(attrs), "text": "",
                              "parents": list(self.open)})

    def handle_endtag(self, tag):
        for i in range(len(self.open) - 1, -1, -1):
            if self.open[i]["tag"] == tag:
                del self.open[i:]
                break

    def handle_data(self, data):
        for element in self.open:
            element["text"] += data

    def find(self, tag=None, cls=None, **attrs):
        found = []
        for e in self.elements:
            if tag and e["tag"] != tag:
                continue
            if cls and cls not in e["attrs"].get("class", "").split():
                continue
            if all(e["attrs"].get(k.replace("_", "-")) == v for k, v in attrs.items()):
                found.append(e)
        return found


def check_dom(path):
    dom = Dom()
    with open(path, encoding="utf-8") as f:
        dom.feed(f.read())
    problems = []

    def expect(condition, what):
        if not condition:
            problems.append(what)

    def inside(e, section_id):
        return any(p["attrs"].get("id") == section_id for p in e["parents"])

    charts = dom.find("svg", "chart")
    tags = {c["attrs"].get("data-tag") for c in charts}
    for tag in ("train/loss", "eval/accuracy", "epoch"):
        expect(any(inside(c, "scalars") for c in dom.find("svg", "chart", data_tag=tag)),
               f"a chart of {tag} in #scalars")
    expect(any(inside(c, "throughput")
               for c in dom.find("svg", "chart", data_tag="train/samples_per_second")),
           "a chart of train/samples_per_second in #throughput")
    expect(not any(t and t.startswith("step_time/") for t in tags),
           "no curve of a step_time/ tag (they are the breakdown)")
    for c in charts:
        line = [p for p in dom.find("path", "series") if c in p["parents"]]
        expect(line and line[0]["attrs"].get("d", "").startswith("M"),
               f"chart {c['attrs'].get('data-tag')} draws its line")
    loss = dom.find("figure", "chart-box", data_tag="train/loss")
    expect(loss and "0.05 at step 200" in loss[0]["text"],
           "train/loss's caption ends at the resumed run's 0.05 at step 200 (later values win)")
    expect(loss and "200 points" in loss[0]["text"], "train/loss has 200 steps (no duplicates)")

    expect(len(dom.find("svg", "breakdown")) == 1, "the step-time breakdown chart")
    bars = {b["attrs"].get("data-rank"): b for b in dom.find("g", "rank-bar")}
    expect(set(bars) == {"0", "1"}, f"a breakdown bar per rank 0 and 1, got {sorted(bars)}")
    for rank, bar in bars.items():
        phases = {r["attrs"].get("data-phase") for r in dom.find("rect", "phase")
                  if bar in r["parents"]}
        expect(phases == {"data", "forward_backward", "all_reduce", "optimizer", "other"},
               f"rank {rank}'s bar stacks the five phases, got {sorted(p for p in phases if p)}")
    expect("1" in bars and "straggler" in bars["1"]["attrs"].get("class", ""),
           "rank 1 (30 % slower) is marked as the straggler")
    expect("0" in bars and "straggler" not in bars["0"]["attrs"].get("class", ""),
           "rank 0 is not a straggler")
    expect([m["attrs"].get("data-rank") for m in dom.find(None, "straggler-marker")] == ["1"],
           "the straggler marker names rank 1")
    expect(len(dom.find("ul", "legend")) == 1 and len(dom.find("li", None)) >= 5,
           "the phases' legend")

    attempts = dom.find("section", None, id="attempts")
    expect(attempts and attempts[0]["attrs"].get("data-restarts") == "1",
           "#attempts says 1 restart (data-restarts)")
    count = dom.find(None, None, id="restart-count")
    expect(count and count[0]["text"].strip() == "1", "#restart-count reads 1")
    failed = dom.find("div", "attempt", data_attempt="0", data_failed="true")
    expect(bool(failed), "attempt 0 is shown as failed")
    tails = [p for p in dom.find("pre", "stderr-tail", data_rank="1")
             if failed and failed[0] in p["parents"]]
    expect(tails and "CUDA out of memory" in tails[0]["text"],
           "attempt 0 shows rank 1's stderr with its error")
    expect(tails and "<script>" in tails[0]["text"],
           "the stderr's markup is shown as text (escaped)")
    expect(not dom.find("script"), "no <script> element: log text must be escaped")

    rows = dom.find("tr", "checkpoint")
    expect([r["attrs"].get("data-step") for r in rows] == ["100", "200", "-1"],
           f"checkpoint rows at steps 100, 200 and an incomplete one, got "
           f"{[r['attrs'].get('data-step') for r in rows]}")
    expect(rows and "incomplete" in rows[-1]["text"], "the checkpoint without manifest is incomplete")
    expect(len(dom.find("line", "checkpoint-mark")) >= 2, "checkpoint steps marked on the charts")

    config = {r["attrs"].get("data-name"): r["text"] for r in dom.find("tr", "config-row")}
    expect(set(config) == {"lr", "batch_size", "optimizer"}, f"the config table, got {config}")
    expect("0.0005" in config.get("lr", ""), "the resumed run's config (lr 0.0005)")
    expect('adam <&> "quoted"' in config.get("optimizer", ""), "config text shown verbatim")

    for p in problems:
        print("report DOM check: missing or wrong:", p)
    print(f"report DOM check: {len(charts)} charts, {len(bars)} rank bars, {len(rows)} "
          f"checkpoint rows; {len(problems)} problem(s)")
    return 1 if problems else 0


def png_pixels(path):
    """Decodes an 8-bit RGB or RGBA non-interlaced PNG (what Chromium writes) by the book."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    if depth != 8 or colour not in (2, 6) or interlace:
        raise ValueError(f"unexpected PNG kind: depth {depth}, colour type {colour}")
    bpp = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def check_png(path):
    width, height, bpp, rows = png_pixels(path)
    colours, inked = set(), 0
    for row in rows:
        for x in range(0, len(row), bpp):
            rgb = row[x:x + 3]
            colours.add(rgb)
            inked += rgb != b"\xff\xff\xff"
    share = inked / (width * height)
    print(f"report screenshot: {width}x{height}, {len(colours)} colours, "
          f"{100 * share:.1f} % not white")
    # Text and lines alone give a few percent; the charts' and bars' colours many shades.
    return 0 if len(colours) >= 50 and share >= 0.03 else 1


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "run":
        write_run(sys.argv[2])
    elif what == "checkpoint":
        write_checkpoint(sys.argv[2], int(sys.argv[3]))
    elif what == "dom":
        sys.exit(check_dom(sys.argv[2]))
    elif what == "png":
        sys.exit(check_png(sys.argv[2]))
    else:
        sys.exit(__doc__)
