"""python -m stoker.doctor [--out DIR] [--prometheus-port N] -- COMMAND ...

Runs COMMAND (a Python training script, or torchrun, or a launcher) with the
doctor attached to every Python process it starts, then prints each
process's report: where the step time went and what to change. The exit
status is COMMAND's."""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

SITECUSTOMIZE = '''\
# Written by stoker doctor: attaches the doctor, then runs the sitecustomize this one hides.
import os, sys
try:
    from stoker.doctor import _auto
    _auto.install()
except Exception as e:  # never break the program being examined
    print("stoker doctor: not attached to process %d (%s): %s" % (os.getpid(), sys.executable, e), file=sys.stderr)
here = os.path.dirname(os.path.abspath(__file__))
for entry in sys.path:
    candidate = os.path.join(entry or ".", "sitecustomize.py")
    if os.path.abspath(entry or ".") != here and os.path.exists(candidate):
        with open(candidate) as f:
            exec(compile(f.read(), candidate, "exec"), {"__name__": "sitecustomize", "__file__": candidate})
        break
'''


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("usage: python -m stoker.doctor [--out DIR] [--prometheus-port N] -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="stoker doctor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="where reports and traces go (default: a new temporary folder)")
    parser.add_argument("--prometheus-port", type=int, help="serve each process's metrics on this port + local rank")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        parser.error("no COMMAND after --")
    out = args.out or tempfile.mkdtemp(prefix="stoker-doctor-")
    os.makedirs(out, exist_ok=True)
    # The folder whose sitecustomize attaches the doctor: only the command's processes need it, so it goes
    # when the command ends (one doctor run used to leave one behind in the temporary folder).
    site = tempfile.mkdtemp(prefix="stoker-doctor-site-")
    try:
        status = _run(command, site, out, args.prometheus_port)
    except FileNotFoundError as e:
        print("stoker doctor: cannot run %s: %s" % (command[0], e), file=sys.stderr)
        if args.out is None and not os.listdir(out):
            os.rmdir(out)
        return 127
    finally:
        shutil.rmtree(site, ignore_errors=True)
    reports = sorted(glob.glob(os.path.join(out, "rank-*.json")))
    if not reports:
        if args.out is None and not os.listdir(out):
            os.rmdir(out)  # a folder of our own, left empty: nothing to look at
            where = ""
        else:
            where = "; reports would be in %s" % out
        print("stoker doctor: no Python process reported a training loop (no DataLoader, stoker.Loader or "
              "stoker.TokenLoader iterated)%s" % where, file=sys.stderr)
    loaded = []
    for path in reports:
        with open(path) as f:
            r = json.load(f)
        loaded.append(r)
        print("=== stoker doctor, rank %s (pid %s): %s" % (r["rank"], r["pid"], " ".join(r["argv"])))
        print(r["report"])
    if len(loaded) > 1:
        # Ranks wait for the slowest at every collective: name it, and what holds it back.
        print("=== all %d processes (the slowest first)" % len(loaded))
        rate = lambda r: r["account"]["steps"] / r["account"]["wall_s"] if r["account"]["wall_s"] else 0.0  # noqa: E731
        for r in sorted(loaded, key=rate):
            first = r["verdict"][0]["finding"] if r["verdict"] else "compute-bound"
            print("  rank %-6s %6d steps  %7.1f ms/step  %s" % (
                r["rank"], r["account"]["steps"], 1000.0 / rate(r) if rate(r) else 0.0, first))
    if reports:
        print("reports and traces (Perfetto, chrome://tracing): %s" % out)
    return status


def _run(command, site, out, prometheus_port):
    """Runs the command with the doctor attached; its exit status (FileNotFoundError: it could not start)."""
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE)
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([site, package_root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["STOKER_DOCTOR_OUT"] = out
    if prometheus_port is not None:
        env["STOKER_DOCTOR_PORT"] = str(prometheus_port)
    try:
        return subprocess.call(command, env=env)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
