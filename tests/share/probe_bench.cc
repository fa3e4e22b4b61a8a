// bench: what a call costs (run with and without the interposer; the
// difference is its cost). compute: launches kernels of a given length for
// a while and says how many went (the compute share's throughput).
#include <algorithm>
#include <chrono>
#include <string>

#include "probe_util.h"

namespace probe {
namespace {

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

CUfunction Kernel(const Driver& d, const std::string& name) {
  static const char image[] = "fake module";
  CUmodule module = nullptr;
  CUfunction f = nullptr;
  Check(d.ModuleLoadData(&module, image), "cuModuleLoadData");
  Check(d.ModuleGetFunction(&f, module, name.c_str()), "cuModuleGetFunction");
  return f;
}

std::uint64_t EnvArg(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

}  // namespace

int Bench(const Driver& d) {
  const std::uint64_t n = EnvArg("PROBE_ITERATIONS", 200000);
  Check(d.Init(0), "cuInit");
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  Check(d.DeviceGet(&dev, 0), "cuDeviceGet");
  Check(d.CtxCreate(&ctx, 0, dev), "cuCtxCreate");
  const CUfunction f = Kernel(d, "spin_0");
  double alloc_best = 1e9, launch_best = 1e9, info_best = 1e9;
  for (int round = 0; round < 5; ++round) {
    double t = Seconds();
    for (std::uint64_t i = 0; i < n; ++i) {
      CUdeviceptr p = 0;
      Check(d.MemAlloc(&p, 1 << 20), "cuMemAlloc");
      Check(d.MemFree(p), "cuMemFree");
    }
    alloc_best = std::min(alloc_best, (Seconds() - t) / static_cast<double>(n));
    t = Seconds();
    for (std::uint64_t i = 0; i < n; ++i)
      Check(d.LaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr), "launch");
    launch_best = std::min(launch_best, (Seconds() - t) / static_cast<double>(n));
    t = Seconds();
    for (std::uint64_t i = 0; i < n / 10; ++i) {
      size_t free_bytes = 0, total = 0;
      Check(d.MemGetInfo(&free_bytes, &total), "cuMemGetInfo");
    }
    info_best = std::min(info_best, (Seconds() - t) / static_cast<double>(n / 10));
  }
  std::printf("{\"alloc_free_ns\": %.1f, \"launch_ns\": %.1f, \"mem_get_info_ns\": %.1f, \"iterations\": %llu}\n",
              alloc_best * 1e9, launch_best * 1e9, info_best * 1e9, static_cast<unsigned long long>(n));
  return 0;
}

int Compute(const Driver& d) {
  const double seconds = static_cast<double>(EnvArg("PROBE_SECONDS", 3000)) / 1000.0;
  const std::uint64_t micros = EnvArg("PROBE_KERNEL_US", 1000), sync_every = EnvArg("PROBE_SYNC_EVERY", 4);
  Check(d.Init(0), "cuInit");
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  Check(d.DeviceGet(&dev, 0), "cuDeviceGet");
  Check(d.CtxCreate(&ctx, 0, dev), "cuCtxCreate");
  const CUfunction f = Kernel(d, "spin_" + std::to_string(micros));
  const double start = Seconds();
  std::uint64_t launches = 0;
  while (Seconds() - start < seconds) {
    Check(d.LaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr), "cuLaunchKernel");
    if (++launches % sync_every == 0) Check(d.StreamSynchronize(nullptr), "cuStreamSynchronize");
  }
  Check(d.CtxSynchronize(), "cuCtxSynchronize");
  const double wall = Seconds() - start;
  const Charges c = LedgerCharges(d, 0);
  std::printf("{\"launches\": %llu, \"device_seconds\": %.3f, \"wall_seconds\": %.3f, \"throttled_ms\": %.1f}\n",
              static_cast<unsigned long long>(launches), static_cast<double>(launches * micros) / 1e6, wall,
              static_cast<double>(c.throttled_ns) / 1e6);
  return 0;
}

}  // namespace probe
