"""Store calls that may hang (a cut network): run on a thread of their own,
left behind when they do not return in time, and ended at the end."""
import os
import queue
import threading
import time


class _Caller:
    """Runs store calls on a thread with a client of its own. A call that has
    not returned after ``patience`` seconds raises TimeoutError, and that
    thread and its client are left behind (blocked, to end when their call
    does): the next call starts afresh on a new connection. At most
    ``max_left`` are left behind at once; past that, calls queue on the
    last one."""

    def __init__(self, connect, patience, max_left=4):
        self._connect, self.patience, self.max_left = connect, patience, max_left
        self._worker, self._left = None, []

    def run(self, fn):
        self._left = [w for w in self._left if w.is_alive()]
        if self._worker is None:
            self._worker = _CallerThread(self._connect)
        box = self._worker.submit(fn)
        if not box.done.wait(self.patience):
            if len(self._left) < self.max_left:
                self._worker.retire()
                self._left.append(self._worker)
                self._worker = None
            raise TimeoutError("a store call did not return within %.1f s" % self.patience)
        if box.error is not None:
            self._worker.retire()  # a client whose call failed may be out of step with the server
            self._worker = None
            raise box.error
        return box.result

    def close(self):
        if self._worker is not None:
            self._worker.retire()

    def end(self, endpoint, wait):
        """At the end: store calls still blocked (left behind on a cut
        network) are ended by shutting down their connections, and their
        threads joined (for at most ``wait`` seconds). A thread whose call
        returned only once the interpreter was finalizing would be unwound
        by pthread_exit through C++ frames that do not allow it, and the
        process would abort ("terminate called without an active
        exception") after training had finished."""
        self.close()
        threads = [t for t in self._left + [self._worker] if t is not None and t.is_alive()]
        if not threads:
            return
        _shutdown_connections_to(endpoint)
        deadline = time.monotonic() + wait
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))


def _shutdown_connections_to(endpoint):
    """Shuts down this process's TCP connections to ``endpoint`` (host:port):
    calls blocked on them return with an error at once."""
    import socket
    host, _, port_text = endpoint.rpartition(":")
    try:
        port = int(port_text)
        addresses = {info[4][0] for info in socket.getaddrinfo(host.strip("[]"), port, proto=socket.IPPROTO_TCP)}
    except (ValueError, OSError):
        return
    addresses |= {"::ffff:" + a for a in addresses if ":" not in a}
    inodes = set()
    for table, family in (("/proc/self/net/tcp", socket.AF_INET), ("/proc/self/net/tcp6", socket.AF_INET6)):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            remote_hex, remote_port = fields[2].split(":")
            if int(remote_port, 16) != port:
                continue
            raw = bytes.fromhex(remote_hex)
            # The kernel prints each 32-bit word in host (little-endian) order.
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            if socket.inet_ntop(family, raw) in addresses:
                inodes.add(fields[9])
    if not inodes:
        return
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            try:
                with socket.socket(fileno=os.dup(int(fd))) as s:
                    s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Box:
    def __init__(self, fn):
        self.fn, self.result, self.error, self.done = fn, None, None, threading.Event()


class _CallerThread(threading.Thread):
    def __init__(self, connect):
        super().__init__(daemon=True, name="stoker-elastic-store-call")
        self._connect, self._jobs, self._retired = connect, queue.Queue(), False
        self.start()

    def submit(self, fn):
        box = _Box(fn)
        self._jobs.put(box)
        return box

    def retire(self):
        self._retired = True
        self._jobs.put(None)

    def run(self):
        store = None
        while True:
            box = self._jobs.get()
            if box is None:
                return
            try:
                if store is None:
                    store = self._connect()
                box.result = box.fn(store)
            except Exception as e:  # noqa: BLE001 - handed to the caller
                box.error = e
            box.done.set()
            if self._retired:
                return
