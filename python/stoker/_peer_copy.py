"""In-memory copies of a sharded checkpoint on a peer (Gemini, SOSP 2023;
docs/checkpoint.md, "Copies in a peer's memory").

With ``Checkpointer(..., replicate_to_peer=True)`` each rank, after every
save's snapshot, copies the pieces it writes into its machine's memory
(files in /dev/shm, so that they outlive a restarted process) and sends
them to a peer, which keeps them in its machine's memory too. Every distinct
piece of the step then lies in two machines' memory. A restarted job calls
``load_latest(directory, target=..., from_peers=True)`` on every rank: the
ranks list the copies their machines hold, and when the copies of one step
cover every piece and that step is not older than the newest checkpoint in
storage, each rank gets exactly its slices from whichever rank holds them,
over the process group, without reading storage.

The copying runs on a thread of its own, beside the persist; the training
loop waits only for the snapshot, as without it. A copy that fails is
logged and counted (stats()["peer_copy_failures"]), never raised in the
training loop: the checkpoint in storage is unaffected.
"""
import ctypes
import datetime
import hashlib
import json
import logging
import mmap
import os
import threading
import time

from . import _native

log = logging.getLogger("stoker.checkpoint")

_ALIGN = 64  # every piece starts here in a copy (any dtype's alignment)
_BLOCK_ALIGN = 16  # every block in a transfer buffer
_FORMAT = 1


def _torch():
    import torch
    return torch


def memory_dir_for(directory, memory_dir=None):
    """Where this machine keeps the copies of checkpoint `directory`: one
    folder per directory (as the program names it) under /dev/shm."""
    if memory_dir is not None:
        return os.fspath(memory_dir)
    digest = hashlib.sha1(str(directory).encode()).hexdigest()[:16]
    return os.path.join("/dev/shm", "stoker-peer-%d" % os.getuid(), digest)


def peer_offset(world_size):
    """How far away (in ranks) a rank's peer is: the same local rank on the
    next machine (torchrun's LOCAL_WORLD_SIZE), so that the copy survives
    the loss of the machine; the next rank when there is one machine."""
    try:
        local = int(os.environ.get("LOCAL_WORLD_SIZE") or 1)
    except ValueError:
        local = 1
    offset = local % world_size
    return offset or 1


def _round_up(n, to):
    return (n + to - 1) // to * to


def _global_rank(group, rank):
    dist = _torch().distributed
    if group is None or group is dist.group.WORLD:
        return rank
    get = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
    return get(group, rank)


def transfer_group(group):
    """A gloo group over the checkpointer's ranks for the host-memory
    transfers: a new one when the group is the whole job (any backend; made
    collectively, as the Checkpointer is), the group itself when it is a
    gloo subgroup."""
    dist = _torch().distributed
    if group is dist.group.WORLD:
        return dist.new_group(backend="gloo")
    if dist.get_backend(group) == "gloo":
        return group
    raise ValueError("replicate_to_peer=True sends host memory over gloo: with a %s subgroup, pass a gloo group "
                     "over the same ranks (torch.distributed.new_group(ranks, backend='gloo')) as group="
                     % dist.get_backend(group))


class _File:
    """A file of `size` bytes in the memory folder, mapped writable; its
    space is reserved first (posix_fallocate), so that a full /dev/shm is an
    error here, not a SIGBUS on a later write."""

    def __init__(self, path, size):
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            if size:
                os.posix_fallocate(fd, 0, size)
                self.map = mmap.mmap(fd, size)
            else:
                self.map = None
        except OSError as e:
            os.close(fd)
            os.unlink(path)
            raise OSError(e.errno, "reserving %d bytes for an in-memory checkpoint copy in %s: %s"
                          % (size, os.path.dirname(path), e.strerror)) from None
        os.close(fd)

    def tensor(self):
        torch = _torch()
        if self.map is None:
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer(self.map, dtype=torch.uint8)

    def checksum(self):
        return _native.xxh3(self.map) if self.map is not None else _native.xxh3(b"")

    def close(self):
        if self.map is not None:
            self.map.close()
            self.map = None


def _copy_name(holder, source, step, save_id):
    return "copy-h%05d-s%05d-step%d-%s" % (holder, source, step, save_id)


def _write_meta(folder, meta):
    name = _copy_name(meta["holder"], meta["source"], meta["step"], meta["save_id"])
    temp = os.path.join(folder, ".%s.json.partial" % name)
    with open(temp, "w") as f:
        json.dump(meta, f, separators=(",", ":"))
    os.rename(temp, os.path.join(folder, name + ".json"))  # its presence says the copy is complete


class PeerCopies:
    """A Checkpointer's copies: the exchange after each save (on a thread of
    its own) and the stats."""

    def __init__(self, group, directory, memory_dir, timeout):
        dist = _torch().distributed
        self.rank, self.world_size = group.rank, group.world_size
        self.folder = memory_dir_for(directory, memory_dir)
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        self.transfer = transfer_group(group.group)
        offset = peer_offset(self.world_size)
        self.next = _global_rank(self.transfer, (self.rank + offset) % self.world_size)
        # Mappings a transfer that did not finish may still touch: never unmapped.
        self._unsettled = []
        self._settled = True
        self.next_rank = (self.rank + offset) % self.world_size
        self.prev_rank = (self.rank - offset) % self.world_size
        self.prev = _global_rank(self.transfer, self.prev_rank)
        self.timeout = datetime.timedelta(seconds=timeout)
        self.thread = None
        self.stats = {"peer_copies": 0, "peer_copy_failures": 0, "peer_copy_s": None, "peer_copy_bytes": 0,
                      "last_peer_copy_step": None, "last_peer_copy_error": None, "peer_memory_dir": self.folder}
        self._dist = dist

    def busy(self):
        return self.thread is not None and self.thread.is_alive()

    def wait(self):
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    def start(self, native, step, save_id, written, extras):
        """Begins the copy of the save just snapshotted. `written`: the
        layout entries (name, dtype, shape, global shape, offsets) of the
        tensors this rank wrote, in the order given to the native save."""
        snapshot = native.last_snapshot()
        self.thread = threading.Thread(target=self._run, args=(step, save_id, written, snapshot, extras),
                                       name="stoker-peer-copy", daemon=True)
        self.thread.start()

    def _run(self, step, save_id, written, snapshot, extras):
        started = time.monotonic()
        try:
            sent = self._exchange(step, save_id, written, snapshot, extras)
            self._remove_older(step, save_id)
            self.stats["peer_copies"] += 1
            self.stats["peer_copy_s"] = time.monotonic() - started
            self.stats["peer_copy_bytes"] = sent
            self.stats["last_peer_copy_step"] = step
        except Exception as e:  # the storage checkpoint is unaffected: say so, never raise in training
            self.stats["peer_copy_failures"] += 1
            self.stats["last_peer_copy_error"] = "%s: %s" % (type(e).__name__, e)
            log.warning("rank %d: the in-memory copy of checkpoint step %d was not made (%s: %s); the copy in "
                        "storage is unaffected", self.rank, step, type(e).__name__, e)

    def _exchange(self, step, save_id, written, snapshot, extras):
        """Makes this rank's copy and swaps copies with the peers; a copy
        that cannot be made here still takes part in the swap (sending
        none), so that no peer waits for it in vain."""
        torch = _torch()
        own, failure = None, None
        try:
            own, meta = self._own_copy(step, save_id, written, snapshot, extras)
            header = torch.frombuffer(bytearray(json.dumps(meta, separators=(",", ":")).encode()), dtype=torch.uint8)
            blob = own.tensor()
        except Exception as e:
            failure = e
            header = blob = torch.empty(0, dtype=torch.uint8)
        self._settled = False
        try:
            self._swap(step, save_id, header, blob)
        finally:
            del blob
            if own is not None:
                if self._settled:
                    own.close()
                else:
                    self._unsettled.append(own)
        if failure is not None:
            raise failure
        return header.numel() and meta["bytes"]

    def _own_copy(self, step, save_id, written, snapshot, extras):
        """This rank's pieces, from the snapshot buffer into its machine's memory."""
        torch = _torch()
        pieces, position = [], 0
        for source, _, nbytes in snapshot:
            name, dtype, shape, global_shape, offsets = written[source]
            pieces.append([name, dtype, list(shape), list(global_shape), list(offsets), position, nbytes])
            position = _round_up(position + nbytes, _ALIGN)
        name = _copy_name(self.rank, self.rank, step, save_id)
        own = _File(os.path.join(self.folder, "." + name + ".bin"), position)
        try:
            blob = own.tensor()
            for (_, address, nbytes), piece in zip(snapshot, pieces):
                if nbytes:
                    view = torch.frombuffer((ctypes.c_char * nbytes).from_address(address), dtype=torch.uint8)
                    blob[piece[5]:piece[5] + nbytes].copy_(view)
            del blob
            meta = {"format": _FORMAT, "step": step, "save_id": save_id, "world_size": self.world_size,
                    "source": self.rank, "holder": self.rank, "bytes": position, "xxh3": "%016x" % own.checksum(),
                    "pieces": pieces, "extras": extras}
            os.rename(own.path, os.path.join(self.folder, name + ".bin"))
            _write_meta(self.folder, meta)
            return own, meta
        except BaseException:
            own.close()
            try:
                os.unlink(own.path)
            except OSError:
                pass
            raise

    def _swap(self, step, save_id, header, blob):
        """Sends this rank's copy (none when `header` is empty) to the next
        peer and keeps the previous peer's, checked against its checksum,
        in this machine's memory. Sizes first, then each receiver says
        whether it has room, then the bytes: a failure on either side
        ends the swap on both without a wait."""
        torch, dist = _torch(), self._dist
        lengths = torch.tensor([header.numel(), blob.numel()], dtype=torch.int64)
        incoming = torch.zeros(2, dtype=torch.int64)
        sends = [dist.isend(lengths, self.next, group=self.transfer, tag=1)]
        dist.irecv(incoming, self.prev, group=self.transfer, tag=1).wait(self.timeout)
        name = _copy_name(self.rank, self.prev_rank, step, save_id)
        received, problem = None, None
        if int(incoming[0]) == 0:
            problem = "rank %d made no copy of step %d (its log says why)" % (self.prev_rank, step)
        else:
            try:
                received = _File(os.path.join(self.folder, "." + name + ".bin"), int(incoming[1]))
            except OSError as e:
                problem = str(e)
        ready, go = torch.tensor([int(received is not None)], dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
        sends.append(dist.isend(ready, self.prev, group=self.transfer, tag=4))
        dist.irecv(go, self.next, group=self.transfer, tag=4).wait(self.timeout)
        try:
            if int(go[0]) and header.numel():
                sends.append(dist.isend(header, self.next, group=self.transfer, tag=2))
                if blob.numel():
                    sends.append(dist.isend(blob, self.next, group=self.transfer, tag=3))
            receives = []
            if received is not None:
                header_in = torch.empty(int(incoming[0]), dtype=torch.uint8)
                blob_in = received.tensor()
                receives.append(dist.irecv(header_in, self.prev, group=self.transfer, tag=2))
                if blob_in.numel():
                    receives.append(dist.irecv(blob_in, self.prev, group=self.transfer, tag=3))
                del blob_in
            for work in receives + sends:
                work.wait(self.timeout)
            self._settled = True
            if received is None:
                raise RuntimeError("no copy of rank %d's pieces is kept here: %s" % (self.prev_rank, problem))
            meta = json.loads(header_in.numpy().tobytes())
            if (meta.get("step"), meta.get("save_id"), meta.get("source")) != (step, save_id, self.prev_rank):
                raise RuntimeError("rank %d sent the copy of step %s save %s (of rank %s), not step %d save %s"
                                   % (self.prev_rank, meta.get("step"), meta.get("save_id"), meta.get("source"),
                                      step, save_id))
            checksum = "%016x" % received.checksum()
            if checksum != meta["xxh3"]:
                raise RuntimeError("the copy rank %d sent for step %d arrived with xxh3 %s, not %s"
                                   % (self.prev_rank, step, checksum, meta["xxh3"]))
            os.rename(received.path, os.path.join(self.folder, name + ".bin"))
        except BaseException:
            if received is not None:
                try:
                    os.unlink(received.path)
                except OSError:
                    pass
            raise
        finally:
            if received is not None:
                if self._settled:
                    received.close()
                else:
                    self._unsettled.append(received)
        meta["holder"] = self.rank
        _write_meta(self.folder, meta)
        if not int(go[0]) and header.numel():
            raise RuntimeError("rank %d had no room for this rank's copy of step %d (its log says why)"
                               % (self.next_rank, step))

    def _remove_older(self, step, save_id):
        """Removes the copies this rank held of other saves (and any it
        left half written when killed), and those of holders beyond the
        current world (left by a larger earlier job). A
        restore then finds either this step complete or, where another
        rank's copy of it failed, too little in memory and reads storage."""
        partial = ".copy-h%05d-" % self.rank  # what a killed process of this rank left half written
        try:
            leftovers = [n for n in os.listdir(self.folder) if n.startswith(partial) and ("-" + save_id + ".") not in n]
        except OSError:
            leftovers = []
        for name in leftovers:
            try:
                os.unlink(os.path.join(self.folder, name))
            except OSError:
                pass
        for entry in _entries(self.folder):
            holder, _, entry_step, entry_save = entry[1]
            if (holder == self.rank or holder >= self.world_size) and (entry_step, entry_save) != (step, save_id):
                for suffix in (".json", ".bin"):
                    try:
                        os.unlink(os.path.join(self.folder, entry[0] + suffix))
                    except OSError:
                        pass


def _entries(folder):
    """(name, (holder, source, step, save id)) of the complete copies in `folder`."""
    out = []
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    for file_name in names:
        if not (file_name.startswith("copy-h") and file_name.endswith(".json")):
            continue
        name = file_name[:-5]
        try:
            holder, source, step, save_id = name[len("copy-"):].split("-", 3)
            out.append((name, (int(holder[1:]), int(source[1:]), int(step[4:]), save_id)))
        except ValueError:
            continue
    return out
