"""What the doctor reads from the GPU: CUDA events on torch's current stream
(mapped onto the host's clock), and NVML's utilisation and memory, loaded at
run time with ctypes (no NVML headers or Python bindings needed)."""
import ctypes
import os
import threading


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
    libnvidia-ml.so.1). Raises OSError naming what failed."""

    def __init__(self, index=0, library=None):
        name = library or os.environ.get("STOKER_NVML_LIBRARY") or "libnvidia-ml.so.1"
        self._lib = ctypes.CDLL(name)
        self._check(self._lib.nvmlInit_v2(), "nvmlInit_v2")
        self._device = ctypes.c_void_p()
        self._check(self._lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(self._device)),
                    "nvmlDeviceGetHandleByIndex_v2(%d)" % index)

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
    """Samples utilisation and memory every `interval` seconds on a daemon thread."""

    def __init__(self, nvml, interval=0.1):
        self._nvml, self._interval = nvml, interval
        self.utilization_sum, self.samples, self.memory_used_max, self.memory_total = 0.0, 0, 0, 0
        self.error = None
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
            self.utilization_sum += u
            self.samples += 1
            self.memory_used_max, self.memory_total = max(self.memory_used_max, used), total

    def stop(self):
        self._stop.set()
        self._thread.join()

    def mean_utilization(self):
        return self.utilization_sum / self.samples if self.samples else None


def open_nvml(index=0):
    """(Nvml, None) or (None, why)."""
    try:
        return Nvml(index), None
    except (OSError, AttributeError) as e:
        return None, "NVML (%s): no utilisation or memory figures" % e


