// Launches: every path that puts work on a device (kernels, cooperative
// kernels, graphs, the legacy grid launches) passes the compute gate.
#include <algorithm>

#include "share/interposer/compute_gate.h"
#include "share/interposer/hook_prologue.h"
#include "share/interposer/real_driver.h"

using stoker::share::ComputeGate;

// `stream` and `per_thread` name where the work goes (the turn's end
// waits for it there; a stream being captured needs no turn).
#define STOKER_LAUNCH(variant, pfn, params, args, stream, per_thread)     \
  STOKER_HOOK CUresult CUDAAPI variant params {                           \
    STOKER_PROLOGUE(variant, pfn)                                         \
    const int counted = ComputeGate::Get().Enter(ip, stream, per_thread); \
    const CUresult r = real args;                                         \
    ComputeGate::Get().Leave(counted);                                    \
    return r;                                                             \
  }

#define KERNEL_PARAMS                                                                                                  \
  (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz, \
   unsigned int shared, CUstream stream, void** params, void** extra)
#define KERNEL_ARGS (f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
#define COOPERATIVE_PARAMS                                                                                             \
  (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz, \
   unsigned int shared, CUstream stream, void** params)
#define COOPERATIVE_ARGS (f, gx, gy, gz, bx, by, bz, shared, stream, params)

STOKER_LAUNCH(cuLaunchKernel, PFN_cuLaunchKernel_v4000, KERNEL_PARAMS, KERNEL_ARGS, stream, false)
STOKER_LAUNCH(cuLaunchKernel_ptsz, PFN_cuLaunchKernel_v7000_ptsz, KERNEL_PARAMS, KERNEL_ARGS, stream, true)
STOKER_LAUNCH(cuLaunchKernelEx, PFN_cuLaunchKernelEx_v11060,
              (const CUlaunchConfig* config, CUfunction f, void** params, void** extra), (config, f, params, extra),
              config ? config->hStream : nullptr, false)
STOKER_LAUNCH(cuLaunchKernelEx_ptsz, PFN_cuLaunchKernelEx_v11060_ptsz,
              (const CUlaunchConfig* config, CUfunction f, void** params, void** extra), (config, f, params, extra),
              config ? config->hStream : nullptr, true)
STOKER_LAUNCH(cuLaunchCooperativeKernel, PFN_cuLaunchCooperativeKernel_v9000, COOPERATIVE_PARAMS, COOPERATIVE_ARGS,
              stream, false)
STOKER_LAUNCH(cuLaunchCooperativeKernel_ptsz, PFN_cuLaunchCooperativeKernel_v9000_ptsz, COOPERATIVE_PARAMS,
              COOPERATIVE_ARGS, stream, true)
// Several devices at once (deprecated): the current device's turn, its first stream.
STOKER_LAUNCH(cuLaunchCooperativeKernelMultiDevice, PFN_cuLaunchCooperativeKernelMultiDevice_v9000,
              (CUDA_LAUNCH_PARAMS * params, unsigned int count, unsigned int flags), (params, count, flags),
              params&& count ? params[0].hStream : nullptr, false)
STOKER_LAUNCH(cuLaunch, PFN_cuLaunch_v2000, (CUfunction f), (f), nullptr, false)
STOKER_LAUNCH(cuLaunchGrid, PFN_cuLaunchGrid_v2000, (CUfunction f, int w, int h), (f, w, h), nullptr, false)
STOKER_LAUNCH(cuLaunchGridAsync, PFN_cuLaunchGridAsync_v2000, (CUfunction f, int w, int h, CUstream s), (f, w, h, s), s,
              false)

namespace {

using GraphRun = stoker::share::Interposer::GraphRun;

// Where a launch into `stream` runs, as an identity: a per-thread default
// stream is its thread's own.
const void* StreamIdentity(CUstream stream, bool per_thread) {
  static thread_local char own;
  if (stream == CU_STREAM_PER_THREAD || (per_thread && stream == nullptr)) return &own;
  return stream;
}

// Events are destroyed through the driver (the interposer does not hook it).
void DestroyEvent(CUevent event) {
  static const auto destroy =
      reinterpret_cast<PFN_cuEventDestroy_v4000>(stoker::share::DriverSymbol("cuEventDestroy_v2"));
  if (destroy != nullptr) (void)destroy(event);
}

// The memory of graph launches on `ordinal` that may still be running
// beside a launch into `stream` (on other streams: one stream's graphs run
// one after another and reuse their memory). Ended ones are dropped; their
// events are queried in relaxed capture mode, so that this thread's query
// cannot invalidate another thread's capture. graph_mu held.
std::uint64_t RunningBeside(stoker::share::Interposer& ip, int ordinal, const void* stream) {
  if (ip.graph_runs.empty()) return 0;
  const auto& d = ip.driver();
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (d.exchange_capture_mode != nullptr) (void)d.exchange_capture_mode(&mode);
  std::erase_if(ip.graph_runs, [&](const GraphRun& run) {
    if (d.event_query(run.done) == CUDA_ERROR_NOT_READY) return false;
    DestroyEvent(run.done);
    return true;
  });
  if (d.exchange_capture_mode != nullptr) (void)d.exchange_capture_mode(&mode);
  std::uint64_t bytes = 0;
  for (const GraphRun& run : ip.graph_runs)
    if (run.ordinal == ordinal && run.stream != stream) bytes += run.bytes;
  return bytes;
}

// After a launch of a graph with `bytes` of memory into `stream`: an event
// marks its end. Nothing where the stream is being captured (the launch
// did not run) or the driver lacks events. graph_mu held.
void NoteRun(stoker::share::Interposer& ip, int ordinal, CUstream stream, const void* identity, std::uint64_t bytes) {
  const auto& d = ip.driver();
  if (d.event_create == nullptr || d.event_record == nullptr || d.event_query == nullptr) return;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (d.stream_is_capturing != nullptr && d.stream_is_capturing(stream, &status) == CUDA_SUCCESS &&
      status != CU_STREAM_CAPTURE_STATUS_NONE)
    return;
  CUevent done = nullptr;
  if (d.event_create(&done, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return;
  if (d.event_record(done, stream) != CUDA_SUCCESS) {
    DestroyEvent(done);
    return;
  }
  ip.graph_runs.push_back({ordinal, identity, bytes, done});
}

// Graph launches pass the gate. Those of executables with memory nodes are
// admitted for what the device's graph reservation would grow by to hold
// their memory and that of the graphs still running on other streams
// (refused with CUDA_ERROR_OUT_OF_MEMORY over the quota: before, charged
// after the fact), and followed by a read of the reservation; others read
// nothing. Where the driver cannot list nodes, every launch is followed by
// a read, at most every few milliseconds.
template <typename Launch>
CUresult LaunchGraph(stoker::share::Interposer& ip, CUgraphExec exec, CUstream stream, bool per_thread, Launch launch) {
  std::uint64_t bytes = 0;
  bool with_memory = false;
  {
    std::lock_guard<std::mutex> lock(ip.graph_mu);
    if (auto it = ip.graphs_with_memory.find(exec); it != ip.graphs_with_memory.end()) {
      with_memory = true;
      bytes = it->second;
    }
  }
  stoker::share::Dev dev;
  const bool nodes_known = ip.graph_nodes_known.load(std::memory_order_relaxed);
  const bool on_device = (with_memory || !nodes_known) && ip.CurrentDevice(&dev);
  const void* identity = StreamIdentity(stream, per_thread);
  if (with_memory && on_device) {
    std::uint64_t beside = 0;
    {
      std::lock_guard<std::mutex> lock(ip.graph_mu);
      beside = RunningBeside(ip, dev.ordinal, identity);
    }
    if (!ip.AdmitGraphLaunch(dev, bytes + beside)) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const int counted = ComputeGate::Get().Enter(ip, stream, per_thread);
  const CUresult r = launch();
  ComputeGate::Get().Leave(counted);
  if (r == CUDA_SUCCESS && with_memory && on_device) {
    std::lock_guard<std::mutex> lock(ip.graph_mu);
    NoteRun(ip, dev.ordinal, stream, identity, bytes);
  }
  bool refresh = with_memory;
  if (!refresh && !nodes_known) {
    static std::uint64_t last_refresh_ns = 0;
    const std::uint64_t now = stoker::share::MonotonicNs();
    std::uint64_t last = __atomic_load_n(&last_refresh_ns, __ATOMIC_RELAXED);
    refresh = now - last > 5'000'000 &&
              __atomic_compare_exchange_n(&last_refresh_ns, &last, now, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  }
  if (refresh && on_device) ip.RefreshGraphMemory(dev.ordinal);
  return r;
}

// After instantiating `graph` as `*exec`: notes whether it has memory nodes.
void NoteInstantiated(stoker::share::Interposer& ip, CUresult r, CUgraphExec* exec, CUgraph graph) {
  if (r != CUDA_SUCCESS || exec == nullptr) return;
  const auto bytes = ip.GraphMemoryBytes(graph);
  std::lock_guard<std::mutex> lock(ip.graph_mu);
  if (!bytes) ip.graph_nodes_known.store(false, std::memory_order_relaxed);
  if (bytes.value_or(0) > 0) ip.graphs_with_memory[*exec] = *bytes;
}

}  // namespace

STOKER_HOOK CUresult CUDAAPI cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  STOKER_PROLOGUE(cuGraphLaunch, PFN_cuGraphLaunch_v10000)
  return LaunchGraph(ip, exec, stream, false, [&] { return real(exec, stream); });
}
STOKER_HOOK CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
  STOKER_PROLOGUE(cuGraphLaunch_ptsz, PFN_cuGraphLaunch_v10000_ptsz)
  return LaunchGraph(ip, exec, stream, true, [&] { return real(exec, stream); });
}

STOKER_HOOK CUresult CUDAAPI cuGraphInstantiate(CUgraphExec* exec, CUgraph graph, CUgraphNode* error_node, char* log,
                                                size_t log_size) {
  STOKER_PROLOGUE(cuGraphInstantiate, PFN_cuGraphInstantiate_v10000)
  const CUresult r = real(exec, graph, error_node, log, log_size);
  NoteInstantiated(ip, r, exec, graph);
  return r;
}
STOKER_HOOK CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec* exec, CUgraph graph, CUgraphNode* error_node, char* log,
                                                   size_t log_size) {
  STOKER_PROLOGUE(cuGraphInstantiate_v2, PFN_cuGraphInstantiate_v11000)
  const CUresult r = real(exec, graph, error_node, log, log_size);
  NoteInstantiated(ip, r, exec, graph);
  return r;
}
STOKER_HOOK CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  STOKER_PROLOGUE(cuGraphInstantiateWithFlags, PFN_cuGraphInstantiateWithFlags_v11040)
  const CUresult r = real(exec, graph, flags);
  NoteInstantiated(ip, r, exec, graph);
  return r;
}
STOKER_HOOK CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec* exec, CUgraph graph,
                                                          CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  STOKER_PROLOGUE(cuGraphInstantiateWithParams, PFN_cuGraphInstantiateWithParams_v12000)
  const CUresult r = real(exec, graph, params);
  NoteInstantiated(ip, r, exec, graph);
  return r;
}
STOKER_HOOK CUresult CUDAAPI cuGraphInstantiateWithParams_ptsz(CUgraphExec* exec, CUgraph graph,
                                                               CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  STOKER_PROLOGUE(cuGraphInstantiateWithParams_ptsz, PFN_cuGraphInstantiateWithParams_v12000_ptsz)
  const CUresult r = real(exec, graph, params);
  NoteInstantiated(ip, r, exec, graph);
  return r;
}
