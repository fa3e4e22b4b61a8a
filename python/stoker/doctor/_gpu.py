"""What the doctor reads from the GPU: CUDA events on torch's current stream
(mapped onto the host's clock), and NVML's utilisation and memory, loaded at
run time with ctypes (no NVML headers or Python bindings needed)."""
import collections
import ctypes
import os
import threading
import time


class TorchGpuTimer:
    """Events on torch's current stream, their completion times on the host
    clock: one synchronised reference event fixes the offset between the
    two clocks."""

    def __init__(self, torch, clock):
        self._torch = torch
        torch.cuda.synchronize()
        self._reference = torch.cuda.Event(enable_timing=True)
        self._reference.record()
        self._reference.synchronize()
        self._origin = clock()

    def record(self):
        event = self._torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def done(event):
        return event.query()

    @staticmethod
    def wait(event):
        event.synchronize()

    def time(self, event):
        return self._origin + self._reference.elapsed_time(event) / 1000.0


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class Nvml:
    """NVML for one device, loaded at run time ($STOKER_NVML_LIBRARY, else
    libnvidia-ml.so.1). ``device``: an NVML index, or a UUID (``GPU-...``,
    a prefix as CUDA_VISIBLE_DEVICES allows). Raises OSError naming what
    failed."""

    def __init__(self, device=0, library=None):
        name = library or os.environ.get("STOKER_NVML_LIBRARY") or "libnvidia-ml.so.1"
        self._lib = ctypes.CDLL(name)
        self._check(self._lib.nvmlInit_v2(), "nvmlInit_v2")
        self._device = ctypes.c_void_p()
        if isinstance(device, int):
            self._check(self._lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(device), ctypes.byref(self._device)),
                        "nvmlDeviceGetHandleByIndex_v2(%d)" % device)
        else:
            self._device = self._by_uuid_prefix(device)
        self.device = device

    def _by_uuid_prefix(self, prefix):
        count = ctypes.c_uint()
        self._check(self._lib.nvmlDeviceGetCount_v2(ctypes.byref(count)), "nvmlDeviceGetCount_v2")
        text = ctypes.create_string_buffer(96)
        for i in range(count.value):
            handle = ctypes.c_void_p()
            if self._lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(i), ctypes.byref(handle)) != 0:
                continue
            if self._lib.nvmlDeviceGetUUID(handle, text, ctypes.c_uint(len(text))) == 0 and \
                    text.value.decode(errors="replace").startswith(prefix):
                return handle
        raise OSError("no NVML device has the UUID %s" % prefix)

    @staticmethod
    def _check(code, what):
        if code != 0:
            raise OSError("%s failed (NVML error %d)" % (what, code))

    def utilization(self):
        """Percent of the last sample period in which a kernel ran."""
        u = _Utilization()
        self._check(self._lib.nvmlDeviceGetUtilizationRates(self._device, ctypes.byref(u)),
                    "nvmlDeviceGetUtilizationRates")
        return u.gpu

    def memory(self):
        """(used, total) bytes."""
        m = _Memory()
        self._check(self._lib.nvmlDeviceGetMemoryInfo(self._device, ctypes.byref(m)), "nvmlDeviceGetMemoryInfo")
        return m.used, m.total


class NvmlSampler:
    """Samples utilisation and memory every ``interval`` seconds on a daemon
    thread. The mean the account uses covers only the samples taken while
    ``counting`` (the doctor turns it on after warm-up and off during
    evaluation); ``window_utilization()`` is the mean of the last
    ``window`` seconds, whatever the loop did."""

    def __init__(self, nvml, interval=0.1, window=60.0, clock=time.monotonic):
        self._nvml, self._interval, self._clock = nvml, interval, clock
        self.utilization_sum, self.samples, self.memory_used_max, self.memory_total = 0.0, 0, 0, 0
        self.counting = True
        self.error = None
        self._recent = collections.deque(maxlen=max(1, int(window / interval)))
        self._window = window
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="stoker-doctor-nvml")
        self._thread.start()

    def _run(self):
        while not self._stop.wait(self._interval):
            try:
                u = self._nvml.utilization()
                used, total = self._nvml.memory()
            except OSError as e:
                self.error = str(e)
                return
            with self._lock:
                if self.counting:
                    self.utilization_sum += u
                    self.samples += 1
                self._recent.append((self._clock(), u))
                self.memory_used_max, self.memory_total = max(self.memory_used_max, used), total

    def stop(self):
        self._stop.set()
        self._thread.join()

    def mean_utilization(self):
        with self._lock:
            return self.utilization_sum / self.samples if self.samples else None

    def window_utilization(self):
        with self._lock:
            since = self._clock() - self._window
            recent = [u for t, u in self._recent if t >= since]
        return sum(recent) / len(recent) if recent else None


def visible_device(local_index, torch=None):
    """The NVML device (index or UUID prefix) behind CUDA's device
    ``local_index`` in this process: torch's UUID where it gives one, else
    the entry of CUDA_VISIBLE_DEVICES (indices or UUIDs), else the index."""
    if torch is not None:
        try:
            uuid = str(torch.cuda.get_device_properties(local_index).uuid)
            if uuid:
                return uuid if uuid.startswith(("GPU-", "MIG-")) else "GPU-" + uuid
        except Exception:  # older torch: no uuid
            pass
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return local_index
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if local_index >= len(entries):
        return local_index
    entry = entries[local_index]
    return int(entry) if entry.isdigit() else entry


def open_nvml(device=0):
    """(Nvml, None) or (None, why)."""
    try:
        return Nvml(device), None
    except (OSError, AttributeError) as e:
        return None, "NVML (%s): no utilisation or memory figures" % e
