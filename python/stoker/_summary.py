"""What stoker.Loader says at the end of an epoch, beside its counters."""


def decode_summary(native):
    """The epoch summary's tail: autotune's choices and where images were decoded."""
    s = native.stats().as_dict()
    tuned = ""
    if s["autotune"]:
        tuned = "; autotune: %d threads, prefetch %d (%d changes, the last at batch %d)" % (
            s["threads"], s["prefetch"], s["autotune_changes"], s["autotune_last_change_batch"])
    d = native.device_stats()
    if not d.get("decoder"):
        return tuned
    if d["decoder"].startswith("CPU: "):
        return tuned + "; decode: CPU (%s)" % d["decoder"][5:]
    on_cpu = sum(d["decoded_on_cpu_by_reason"].values()) + d["decode_no_room"] + d["decode_cpu_after_error"]
    skipped = ""
    if d["decode_corrupt_skipped"]:
        skipped = ", %d corrupt replaced" % d["decode_corrupt_skipped"]
    return tuned + "; decode: %s, %d images on the GPU (%d hardware), %d on the CPU%s" % (
        d["decoder"], d["decoded_on_device"], d["decoded_on_hardware"], on_cpu, skipped)
