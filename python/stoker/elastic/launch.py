"""python -m stoker.elastic.launch: torchrun's flags, on torch 1.13 as on 2.x.

    python -m stoker.elastic.launch --nproc-per-node 4 --nnodes 1:4 \\
        --rdzv-backend c10d --rdzv-endpoint head:29400 --rdzv-id job7 train.py ...

By default this is torchrun (torch.distributed.run) with the fixes Debian's
torch 1.13 needs on Python 3.11 and tuned elastic settings: workers are
checked every 0.5 s instead of 5, a rendezvous that has its minimum waits 2 s
instead of 30 for more nodes, a node that stops answering is dropped after
3 s instead of 15, and workers restart up to 100 times. Any of them can
be given explicitly.

With ``--in-process`` the workers are not restarted: this launcher hosts (or
joins) a store at --rdzv-endpoint, starts --nproc-per-node workers, and
tells the store when one dies; survivors re-form their group there and a
worker started later (another launcher on the same endpoint) joins it.
``--min-workers``/``--max-workers`` bound the group (default: --nnodes
times --nproc-per-node).
"""
import argparse
import difflib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

log = logging.getLogger("stoker.elastic")

_TORCHRUN_DEFAULTS = {"monitor_interval": "0.5", "max_restarts": "100"}
_RDZV_CONF_DEFAULTS = {"last_call_timeout": "2", "join_timeout": "600", "close_timeout": "10"}


def _parser():
    p = argparse.ArgumentParser(prog="python -m stoker.elastic.launch", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)

    def opt(name, **kw):
        p.add_argument("--" + name, "--" + name.replace("-", "_"), dest=name.replace("-", "_"), **kw)

    opt("nproc-per-node", default="1", help="workers on this node (torchrun's)")
    opt("nnodes", default="1", help="N or MIN:MAX nodes")
    opt("rdzv-backend", default=None, help="c10d, etcd, etcd-v2 or static (torchrun's)")
    opt("rdzv-endpoint", default=None, help="HOST:PORT of the rendezvous")
    opt("rdzv-id", default=None, help="the job's id, the same on every node")
    opt("rdzv-conf", default=None, help="KEY=VALUE,... rendezvous settings")
    opt("standalone", action="store_true", help="one node, a local rendezvous")
    opt("max-restarts", default=None)
    opt("monitor-interval", default=None)
    opt("node-rank", default=None)
    opt("master-addr", default=None)
    opt("master-port", default=None)
    opt("start-method", default=None)
    opt("log-dir", default=None)
    opt("redirects", default=None)
    opt("tee", default=None)
    opt("role", default=None)
    opt("in-process", action="store_true", help="survivors re-form the group instead of restarting")
    opt("join", action="store_true",
        help="--in-process: add workers to the job running at --rdzv-endpoint; an error when none runs there "
             "(without it, a launcher that finds no store hosts one and starts the job)")
    opt("min-workers", type=int, default=None, help="--in-process: the smallest group")
    opt("max-workers", type=int, default=None, help="--in-process: the largest group")
    opt("replica-group-size", type=int, default=0,
        help="--in-process: the workers form replica groups of this many (in order of local rank), over which "
             "a model is sharded (stoker.elastic.replica_group_mesh() and FSDP2's fully_shard); when one fails, "
             "its group is stopped and started again, and joins the others (up to --max-restarts times, "
             "default 100)")
    opt("max-failed-starts", type=int, default=3,
        help="--in-process --replica-group-size: a replica group whose last N starts each failed before the job "
             "committed a step with it (a program that fails at start-up, or on its first batch) is not started "
             "again (0: no limit but --max-restarts)")
    opt("kill-silent-after", type=float, default=10.0,
        help="--in-process: SIGKILL a worker whose heartbeat stopped this many seconds ago (hung, stopped); "
             "the others go on without it after 3 s either way (0: never)")
    p.add_argument("script", help="the training script")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    return p


def _nodes(text):
    lo, _, hi = str(text).partition(":")
    try:
        lo, hi = int(lo), int(hi or lo)
    except ValueError:
        raise SystemExit("stoker.elastic.launch: --nnodes %r is not N or MIN:MAX" % (text,)) from None
    if lo < 1 or hi < lo:
        raise SystemExit("stoker.elastic.launch: --nnodes %r: need 1 <= MIN <= MAX" % (text,))
    return lo, hi


def _nproc(text):
    try:
        n = int(text)
    except ValueError:
        raise SystemExit("stoker.elastic.launch: --nproc-per-node %r is not a number (give a count)" % (text,)) \
            from None
    if n < 1:
        raise SystemExit("stoker.elastic.launch: --nproc-per-node must be at least 1")
    return n


def torchrun_argv(args):
    """The argument list for torch.distributed.run, with stoker's defaults."""
    argv = []
    values = dict(vars(args))
    for key, default in _TORCHRUN_DEFAULTS.items():
        if values.get(key) is None:
            values[key] = default
    conf = dict(_RDZV_CONF_DEFAULTS)
    if args.rdzv_conf:
        for item in args.rdzv_conf.split(","):
            k, _, v = item.partition("=")
            conf[k.strip()] = v.strip()
    lo, hi = _nodes(args.nnodes)
    if lo == hi and not args.rdzv_backend:
        conf.pop("last_call_timeout", None)
    for key in ("nproc_per_node", "nnodes", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "max_restarts",
                "monitor_interval", "node_rank", "master_addr", "master_port", "start_method", "log_dir",
                "redirects", "tee", "role"):
        if values.get(key) is not None:
            argv += ["--" + key, str(values[key])]
    if args.standalone:
        argv.append("--standalone")
    if args.rdzv_backend or args.standalone or lo != hi:
        argv += ["--rdzv_conf", ",".join("%s=%s" % kv for kv in conf.items())]
    # "--" before the script: torchrun's parser abbreviates options, so a script's own "--log" would be taken
    # for an ambiguous prefix of torchrun's --log-dir / --logs-specs (torch 2.x) and refused.
    return argv + ["--", args.script] + list(args.script_args)


def _run_torchrun(args):
    from . import _torchrun_compat
    fixes = _torchrun_compat.apply()
    if fixes:
        log.info("stoker.elastic.launch: applied to this torch: %s", ", ".join(fixes))
    lo, _ = _nodes(args.nnodes)
    os.environ.setdefault("STOKER_ELASTIC_MIN_WORLD_SIZE", str(lo * _nproc(args.nproc_per_node)))
    from torch.distributed import run as torch_run
    torch_run.main(torchrun_argv(args))
    return 0


def _host_or_join_store(endpoint, join_only, timeout=600.0):
    from ._group import connect_store
    if not join_only:
        try:
            return connect_store(endpoint, timeout, is_master=True), True
        except (RuntimeError, OSError):
            pass  # another launcher hosts it: join
    try:
        return connect_store(endpoint, 3.0 if join_only else timeout), False
    except (RuntimeError, OSError) as e:  # torch raises TimeoutError (an OSError) or RuntimeError
        raise SystemExit("stoker.elastic.launch: --join: no job runs at %s (%s)" % (endpoint, str(e).splitlines()[0]))


def _silent(beat_file, pid, beats, now, after):
    """Whether the worker's local heartbeat (a file it touches), once seen
    moving, has not moved for ``after`` seconds. A worker that removed its
    file has finished with elastic training and is no longer watched."""
    try:
        value = os.stat(beat_file).st_mtime_ns
    except FileNotFoundError:
        if pid in beats:
            beats[pid] = None  # closed: what the program does after its training is its own business
        return False
    seen = beats.get(pid, ())
    if seen is None:
        return False
    if not seen or seen[0] != value:
        beats[pid] = (value, now)
        return False
    return now - seen[1] > after


def _run_in_process(args):
    nproc = _nproc(args.nproc_per_node)
    lo, hi = _nodes(args.nnodes)
    min_workers = args.min_workers if args.min_workers is not None else lo * nproc
    max_workers = args.max_workers if args.max_workers is not None else hi * nproc
    if not 1 <= min_workers <= max_workers:
        raise SystemExit("stoker.elastic.launch: need 1 <= --min-workers (%d) <= --max-workers (%d)"
                         % (min_workers, max_workers))
    endpoint = args.rdzv_endpoint or "127.0.0.1:29400"
    store, hosting = _host_or_join_store(endpoint, args.join)
    log.info("stoker.elastic.launch: %s the store at %s; %d workers, group of %d to %d", "hosting" if hosting
             else "joining", endpoint, nproc, min_workers, max_workers)
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(k, None)
    # Workers touch a file each here (their heartbeat for this launcher): local, so that a worker cut off
    # from the store is not killed for it, and no store traffic.
    beat_dir = tempfile.mkdtemp(prefix="stoker-elastic-beats-")
    env.update(STOKER_ELASTIC_STORE=endpoint, STOKER_ELASTIC_NNODES_WORKERS="%d:%d" % (min_workers, max_workers),
               STOKER_ELASTIC_MIN_WORLD_SIZE=str(min_workers), STOKER_ELASTIC_BEAT_DIR=beat_dir)
    group_size = args.replica_group_size or 0
    if group_size and (group_size < 1 or nproc % group_size):
        raise SystemExit("stoker.elastic.launch: --replica-group-size %d does not divide --nproc-per-node %d"
                         % (group_size, nproc))
    children = {}
    workers = _Workers(args, env, store, children, group_size)
    for i in range(nproc):
        workers.start(i)

    def forward(signum, frame):
        for proc in children.values():
            if proc.poll() is None:
                proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        return _supervise(args, store, hosting, children, beat_dir, workers)
    finally:
        shutil.rmtree(beat_dir, ignore_errors=True)


class _Workers:
    """Starts the launcher's workers and, with replica groups, starts a
    group again once every worker of it has exited after one failed: the
    others are killed at the first failure (the group's shards are
    incomplete without it), and the new group joins the running job."""

    def __init__(self, args, env, store, children, group_size):
        self.args, self.env, self.store, self.children = args, env, store, children
        self.group_size = group_size
        self.incarnation = {}  # group -> how many times it was started
        self.members = {}  # group -> pids of its current incarnation
        self.stopping = set()  # groups whose workers are being stopped, to be started again
        self.restarts = 0
        self.max_restarts = int(args.max_restarts) if args.max_restarts is not None else 100
        self.group_ids = {}  # group -> the id of its current incarnation (STOKER_ELASTIC_REPLICA_GROUP's)
        self.failed_starts = {}  # group -> its starts in a row that failed before it committed a step
        self.failure_code = {}  # group -> the exit code of the worker whose failure stopped it last

    def start(self, local_rank):
        env = dict(self.env, LOCAL_RANK=str(local_rank))
        if self.group_size:
            group = local_rank // self.group_size
            incarnation = self.incarnation.get(group, 0)
            self.group_ids[group] = "%s-%d-g%d.%d" % (socket.gethostname(), os.getpid(), group, incarnation)
            env.update(LOCAL_WORLD_SIZE=str(self.group_size), STOKER_ELASTIC_REPLICA_GROUP="%s:%d:%d" % (
                self.group_ids[group], local_rank % self.group_size, self.group_size))
        proc = subprocess.Popen([sys.executable, self.args.script] + list(self.args.script_args), env=env)
        proc.local_rank = local_rank
        self.children[proc.pid] = proc
        self.store.add("active", 1)
        if self.group_size:
            self.members.setdefault(group, []).append(proc.pid)
        return proc

    def exited(self, proc, codes):
        """A worker exited (its code is in ``codes``): with replica groups, a
        failure stops its group, and the group starts again once all of it
        has exited."""
        if not self.group_size:
            return
        group = proc.local_rank // self.group_size
        if proc.pid not in self.members.get(group, ()):
            return
        if proc.returncode != 0 and group not in self.stopping:
            self.stopping.add(group)
            self.failure_code[group] = proc.returncode
            for pid in self.members[group]:
                other = self.children[pid]
                if pid not in codes and other.poll() is None:
                    other.kill()
            log.warning("stoker.elastic.launch: replica group %d lost worker %d (exit %d); stopping the group",
                        group, proc.pid, proc.returncode)
        if group in self.stopping and all(pid in codes for pid in self.members[group]):
            self.stopping.discard(group)
            from ._group import _peek
            fatal = _peek(self.store, "fatal")
            if fatal is not None:
                log.error("stoker.elastic.launch: replica group %d is not started again: the job stopped (%s)", group,
                          fatal)
                return
            # The workers mark their group's start as trained at their first commit (_sharded_steps.py).
            trained = _peek(self.store, "trained/" + self.group_ids[group]) is not None
            self.failed_starts[group] = 0 if trained else self.failed_starts.get(group, 0) + 1
            limit = self.args.max_failed_starts
            if limit > 0 and self.failed_starts[group] >= limit:
                log.error("stoker.elastic.launch: replica group %d is not started again: its last %d starts each "
                          "failed before the job committed a step with it (last exit %d; the workers' errors are "
                          "above; --max-failed-starts)", group, self.failed_starts[group], self.failure_code[group])
                return
            if self.restarts >= self.max_restarts:
                log.error("stoker.elastic.launch: replica group %d is not started again: %d restarts "
                          "(--max-restarts)", group, self.restarts)
                return
            self.restarts += 1
            self.incarnation[group] = self.incarnation.get(group, 0) + 1
            self.members[group] = []
            log.warning("stoker.elastic.launch: starting replica group %d again (restart %d); it joins the job",
                        group, self.restarts)
            for local_rank in range(group * self.group_size, (group + 1) * self.group_size):
                self.start(local_rank)


def _supervise(args, store, hosting, children, beat_dir, workers):
    codes = {}
    host = socket.gethostname()
    beats = {}  # pid -> (file's mtime, when it last moved), or None once the worker removed its file
    next_check = 0.0
    while len(codes) < len(children):
        now = time.monotonic()
        check = now >= next_check  # heartbeats every 0.5 s
        if check:
            next_check = now + 0.5
        for pid, proc in list(children.items()):
            if pid in codes:
                continue
            if proc.poll() is None:
                if check and args.kill_silent_after > 0 and _silent(os.path.join(beat_dir, str(pid)), pid, beats,
                                                                    now, args.kill_silent_after):
                    log.warning("stoker.elastic.launch: worker %d sent no heartbeat for %.1f s (hung or stopped); "
                                "killing it", pid, now - beats[pid][1])
                    proc.kill()
                continue
            codes[pid] = proc.returncode
            store.add("active", -1)
            if proc.returncode != 0:
                store.set("dead/%s-%d" % (host, pid), str(proc.returncode))
                log.warning("stoker.elastic.launch: worker %d exited with %d; the others go on without it", pid,
                            proc.returncode)
            workers.exited(proc, codes)
        time.sleep(0.05)
    if hosting:
        # Workers of other launchers may still use the store: keep it until they are done.
        deadline = time.monotonic() + 3600
        while int(store.add("active", 0)) > 0 and time.monotonic() < deadline:
            time.sleep(0.2)
    finished = [c for c in codes.values() if c == 0]
    failed = [c for c in codes.values() if c != 0]
    if not finished:
        return failed[0] if failed and failed[0] > 0 else 1
    return 0


def main(argv=None):
    logging.basicConfig(level=os.environ.get("STOKER_LOG_LEVEL", "INFO"), format="%(asctime)s %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    # The launcher's options end at the script: what follows is the script's own (its --log is not ours).
    flags = {s for a in parser._actions for s in a.option_strings}
    takes_value = {s for a in parser._actions for s in a.option_strings if a.nargs != 0}
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            argv = argv[:i] + argv[i + 1:]
            break
        if not token.startswith("-"):
            break
        name = token.split("=", 1)[0]
        if name not in flags:
            known = sorted(f for f in flags if f.startswith("--") and "_" not in f)  # torchrun's dashed spellings
            close = [f for f in known if f.startswith(name.replace("_", "-"))][:1] or difflib.get_close_matches(
                name.replace("_", "-"), known, n=1, cutoff=0.6)
            parser.error("unknown option %s (before the script)%s" % (token, "; did you mean %s?" % close[0]
                                                                        if close else ""))
        i += 2 if name in takes_value and "=" not in token else 1
    args = parser.parse_args(argv[:i] + ["--"] + argv[i:]) if i < len(argv) else parser.parse_args(argv)
    _nproc(args.nproc_per_node)
    _nodes(args.nnodes)
    if args.replica_group_size and not args.in_process:
        parser.error("--replica-group-size goes with --in-process")
    if args.join and not args.in_process:
        parser.error("--join goes with --in-process (torchrun's agents join through the rendezvous)")
    if args.in_process:
        return _run_in_process(args)
    return _run_torchrun(args)


if __name__ == "__main__":
    sys.exit(main())
