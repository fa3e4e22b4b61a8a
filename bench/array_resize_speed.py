"""Array Resize through the loader on the EuroSAT-shaped chips of
bench/tiff_arrays_bench.py (64 x 64 x 13 uint16, packed; build them with
`bench/tiff_arrays_bench.py --shape eurosat` first): samples/s of the second
epoch without a resize, and with nearest and bilinear resizes up and down.

    PYTHONPATH=build/release/python .venv/bin/python bench/array_resize_speed.py [PACKED]
"""
import sys, time, stoker
T = stoker.transforms
for name, steps in (("none", None), ("Resize(128) nearest", [T.Resize(128, interpolation="nearest")]),
                    ("Resize(128) bilinear", [T.Resize(128)]), ("Resize(32) bilinear", [T.Resize(32)])):
    loader = stoker.Loader(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tiff-bench/eurosat-5000-packed", batch_size=64, num_threads=2, log_epochs=False,
                           fields={"bands": stoker.Array(key="tif", transform=steps)})
    for epoch in range(2):
        t, n = time.perf_counter(), 0
        for batch in loader:
            n += len(batch["bands"])
        dt = time.perf_counter() - t
    print("%-22s %8.0f samples/s  %s" % (name, n / dt, tuple(batch["bands"].shape)))
