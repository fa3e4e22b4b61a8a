#!/usr/bin/env python3
"""Turns a `perf record -a` profile of bench/cpu_split.py into CPU ms per
image by stage (README, "Where each image's CPU time goes"):

    bench/cpu_split_table.py split.perf --loader stoker --rate 6161 \\
        [--decode-split decode.txt] [--json out.json]

Each stage's share of the non-idle samples (by library and function) times
the CPU per image of the profiled window: the CPUs perf sampled (`--cpus`,
this machine's by default) over `--rate` (the images/s cpu_split.py printed
for the window). Where libjpeg has no symbols (Debian's), its share is split
into entropy decoding and the rest by `stoker_decode_bench DATASET --split`'s
output (`--decode-split`): for stoker, that run's entropy : IDCT ratio; for
the DataLoader (whole images), the whole image's entropy time, capped at the
library's share. DALI's own libjpeg-turbo has symbols, so its split is by
function.
"""
import argparse
import json
import os
import re
import subprocess
import sys

IDLE = re.compile(r"safe_halt|default_idle|intel_idle|cpuidle|acpi_idle|poll_idle|mwait_idle")
READ_KERNEL = re.compile(r"copy_to_iter|copy_page_to_iter|filemap_|ext4_|^io_|^__io_|xas_|generic_file_read")
ENTROPY = re.compile(r"^decode_mcu|jpeg_fill_bit_buffer|jpeg_huff_decode|jpeg_make_d_derived_tbl|process_restart")
RESAMPLE = re.compile(r"HorizontalPass|VerticalPass|VerticalChunks|PrecomputeCoeffs|SplitCoefficients|transform::Resample|"
                      r"ImagingResample|precompute_coeffs|normalize_coeffs|[Rr]esampl")
WRITE = re.compile(r"OutputWriter|WriteRows|::Planes<|::Interleaved<|ImagingFlip|ImagingCrop|ImagingPack|ImagingCopy|SliceFlipNormalize")
SEEKABLE = re.compile(r"Seekable|RestartTable|AssembleSeekable")

STAGES = [
    ("read", "read: copy from the page cache, sample checksum"),
    ("entropy", "JPEG entropy (Huffman) decoding"),
    ("idct", "IDCT, upsampling, colour conversion"),
    ("seekable", "assembling the intervals' stream, checking the table"),
    ("resample", "resample (crop to 224 x 224, antialiased bilinear)"),
    ("write", "crop, flip, normalise, write (and torch's ToTensor, Normalize, collate)"),
    ("python", "Python interpreter"),
    ("kernel", "kernel: page faults, worker IPC, shared memory"),
    ("rest", "libc (copies, allocation) and the rest"),
]


def samples(perf_data):
    """(percent of all samples, dso, symbol) rows of the profile, from sample counts (perf's own
    percentages are rounded up per row, and a profile has a thousand rows of one sample)."""
    out = subprocess.run(["perf", "report", "-i", perf_data, "--no-children", "--sort", "dso,sym", "-F",
                          "sample,dso,sym", "--stdio"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"\s*(\d+)\s+(\S+)\s+\[[.k]\]\s+(.*)$", line)
        if m:
            rows.append((int(m.group(1)), m.group(2), m.group(3).strip()))
    total = sum(n for n, _, _ in rows)
    return [(100.0 * n / total, dso, sym) for n, dso, sym in rows]


def stage_of(loader, dso, sym):
    if dso == "[kernel.kallsyms]":
        if IDLE.search(sym):
            return None
        return "read" if READ_KERNEL.search(sym) else "kernel"
    if "xxhash" in dso:
        return "read"
    if "libjpeg" in dso:
        if loader == "dali" or not sym.startswith("0x"):
            return "entropy" if ENTROPY.search(sym) else "idct"
        return "jpeg"  # no symbol: split below
    if SEEKABLE.search(sym):
        return "seekable"
    if RESAMPLE.search(sym):
        return "resample"
    if WRITE.search(sym):
        return "write"
    if dso.startswith("python3") or dso.startswith("libpython"):
        return "python"
    if loader == "dataloader" and dso.startswith("libtorch_cpu"):
        return "write"  # ToTensor, Normalize and collate: the DataLoader's part of the write row
    return "rest"


def decode_split(path):
    """(entropy ms, IDCT-etc ms, whole image's entropy ms) from stoker_decode_bench --split."""
    text = open(path).read()
    m = re.search(r"entropy decoding ([\d.]+) ms.*?\(the whole image's: ([\d.]+)\); IDCT, upsampling and colour "
                  r"([\d.]+) ms", text, re.S)
    if not m:
        raise SystemExit("%s: no 'entropy decoding ... IDCT, upsampling and colour' line "
                         "(stoker_decode_bench --split's output)" % path)
    return float(m.group(1)), float(m.group(3)), float(m.group(2))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("perf_data")
    p.add_argument("--loader", choices=("stoker", "dataloader", "dali"), required=True)
    p.add_argument("--rate", type=float, required=True, help="images/s of the profiled window")
    p.add_argument("--cpus", type=int, default=os.cpu_count(), help="CPUs perf sampled (perf record -a: all)")
    p.add_argument("--decode-split", help="stoker_decode_bench --split output for the same images")
    p.add_argument("--json")
    args = p.parse_args()
    rows = samples(args.perf_data)
    busy = sum(pct for pct, dso, sym in rows if stage_of(args.loader, dso, sym) is not None)
    if busy <= 0:
        raise SystemExit("%s: no busy samples" % args.perf_data)
    ms_per_percent = args.cpus / args.rate * 1e3 / 100.0  # a 1% share of all CPUs' samples, in ms per image
    stages = dict.fromkeys([k for k, _ in STAGES] + ["jpeg"], 0.0)
    for pct, dso, sym in rows:
        stage = stage_of(args.loader, dso, sym)
        if stage is not None:
            stages[stage] += pct * ms_per_percent
    jpeg = stages.pop("jpeg")
    if jpeg > 0:
        if not args.decode_split:
            raise SystemExit("libjpeg has no symbols here: give --decode-split (stoker_decode_bench --split's output)")
        entropy, rest, whole = decode_split(args.decode_split)
        share = min(1.0, whole / jpeg) if args.loader == "dataloader" else entropy / (entropy + rest)
        stages["entropy"] += jpeg * share
        stages["idct"] += jpeg * (1 - share)
    total = sum(stages.values())
    print("%s, %.0f images/s, %.1f%% of the CPUs busy: CPU ms per image" % (args.loader, args.rate, busy))
    for key, label in STAGES:
        print("  %-78s %6.3f" % (label, stages[key]))
    print("  %-78s %6.3f" % ("total", total))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"loader": args.loader, "rate": args.rate, "busy_percent": busy, "ms_per_image": stages}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
