// bench: what a call costs (run with and without the interposer; the
// difference is its cost). compute: launches kernels of a given length for
// a while and says how many went (the compute share's throughput).
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

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

// The driver started, and a context of its own on device 0 made current.
void StartOnDevice0(const Driver& d) {
  Check(d.Init(0), "cuInit");
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  Check(d.DeviceGet(&dev, 0), "cuDeviceGet");
  Check(d.CtxCreate(&ctx, 0, dev), "cuCtxCreate");
}

std::uint64_t EnvArg(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

}  // namespace

int Bench(const Driver& d) {
  const std::uint64_t n = EnvArg("PROBE_ITERATIONS", 200000);
  StartOnDevice0(d);
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
  StartOnDevice0(d);
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

// A process in a container (a PID namespace of its own; NVML lists the
// node's PIDs): allocates, launches once (the fake driver then takes
// FAKE_CUDA_LAUNCH_BYTES that only NVML's per-process figure shows), and
// asks for memory figures every 50 ms. Says its charge after a second
// ("phase 1": the agent has not yet told it its node PID, so NVML cannot
// be matched), then waits up to PROBE_SECONDS for the charge to include
// those bytes (the test's agent runs after phase 1).
int InContainer(const Driver& d) {
  StartOnDevice0(d);
  CUdeviceptr p = 0;
  Check(d.MemAlloc(&p, 64ull << 20), "cuMemAlloc");
  Check(d.LaunchKernel(Kernel(d, "spin_10"), 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr), "cuLaunchKernel");
  Check(d.CtxSynchronize(), "cuCtxSynchronize");
  const std::uint64_t hidden = EnvArg("FAKE_CUDA_LAUNCH_BYTES", 0);
  auto ask = [&] {
    size_t free_bytes = 0, total = 0;
    Check(d.MemGetInfo(&free_bytes, &total), "cuMemGetInfo");
    return LedgerCharges(d, 0).process;
  };
  const double start = Seconds();
  std::uint64_t before = 0;
  while (Seconds() - start < 1.0) {
    before = ask();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::printf("{\"phase\": 1, \"process\": %llu}\n", static_cast<unsigned long long>(before));
  std::fflush(stdout);
  const double limit = static_cast<double>(EnvArg("PROBE_SECONDS", 10000)) / 1000.0;
  std::uint64_t after = before;
  while (Seconds() - start < limit && after < before + hidden) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    after = ask();
  }
  std::printf("{\"pid\": %d, \"before\": %llu, \"after\": %llu, \"hidden\": %llu}\n", static_cast<int>(::getpid()),
              static_cast<unsigned long long>(before), static_cast<unsigned long long>(after),
              static_cast<unsigned long long>(hidden));
  return after >= before + hidden ? 0 : 3;
}

// An NCCL-like job's rank: launches PROBE_COUNT collectives
// ("allreduce_<group>_<peers>_<micros>", which end only when every peer has
// launched the same one) on its card, waiting for them every
// PROBE_SYNC_EVERY; says how long they took.
int Collective(const Driver& d) {
  const std::uint64_t count = EnvArg("PROBE_COUNT", 1000);
  const std::uint64_t micros = EnvArg("PROBE_KERNEL_US", 1000), sync_every = EnvArg("PROBE_SYNC_EVERY", 2);
  StartOnDevice0(d);
  const CUfunction f = Kernel(d, "allreduce_" + std::to_string(EnvArg("PROBE_GROUP", 0)) + "_" +
                                     std::to_string(EnvArg("PROBE_PEERS", 2)) + "_" + std::to_string(micros));
  const double start = Seconds();
  std::uint64_t launched = 0, done = 0;
  double longest_wait = 0;
  while (launched < count) {
    Check(d.LaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr), "cuLaunchKernel");
    if (++launched % sync_every == 0 || launched == count) {
      const double t = Seconds();
      Check(d.StreamSynchronize(nullptr), "cuStreamSynchronize");
      longest_wait = std::max(longest_wait, Seconds() - t);
      done = launched;
    }
  }
  std::printf("{\"collectives\": %llu, \"seconds\": %.3f, \"longest_wait_ms\": %.1f}\n",
              static_cast<unsigned long long>(done), Seconds() - start, longest_wait * 1e3);
  return 0;
}

// Captures a graph on a stream in global mode while this process's compute
// turns come and go (the main thread keeps launching): the capture must
// stay valid, and launches into it must not wait for a turn.
int Capture(const Driver& d) {
  using BeginFn = CUresult (*)(CUstream, CUstreamCaptureMode);
  using EndFn = CUresult (*)(CUstream, CUgraph*);
  using StreamCreateFn = CUresult (*)(CUstream*, unsigned int);
  auto begin = reinterpret_cast<BeginFn>(dlsym(RTLD_DEFAULT, "cuStreamBeginCapture_v2"));
  auto end = reinterpret_cast<EndFn>(dlsym(RTLD_DEFAULT, "cuStreamEndCapture"));
  auto create = reinterpret_cast<StreamCreateFn>(dlsym(RTLD_DEFAULT, "cuStreamCreate"));
  if (!begin || !end || !create) Fail("the driver has no stream capture");
  StartOnDevice0(d);
  const CUfunction f = Kernel(d, "spin_1000");
  CUstream stream = nullptr;
  Check(create(&stream, 1), "cuStreamCreate");
  Check(begin(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture");
  const double start = Seconds();
  double longest_captured_launch = 0;
  std::uint64_t captured = 0, launched = 0;
  while (Seconds() - start < 1.0) {
    // Work that runs: the turns end (time up, idle) and are drained meanwhile.
    for (int i = 0; i < 3; ++i, ++launched)
      Check(d.LaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr), "cuLaunchKernel");
    std::this_thread::sleep_for(std::chrono::milliseconds(launched % 30 == 0 ? 8 : 1));
    const double t = Seconds();
    Check(d.LaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream, nullptr, nullptr), "cuLaunchKernel into the capture");
    longest_captured_launch = std::max(longest_captured_launch, Seconds() - t);
    ++captured;
  }
  CUgraph graph = nullptr;
  const CUresult r = end(stream, &graph);
  if (r != CUDA_SUCCESS)
    Fail("the capture was invalidated while compute turns came and went (" + std::to_string(r) + ")");
  std::printf("{\"capture\": \"ok\", \"captured\": %llu, \"launched\": %llu, \"longest_captured_launch_ms\": %.2f}\n",
              static_cast<unsigned long long>(captured), static_cast<unsigned long long>(launched),
              longest_captured_launch * 1e3);
  return 0;
}

}  // namespace probe
