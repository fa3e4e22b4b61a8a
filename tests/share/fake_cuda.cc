// A test double of the CUDA driver (libcuda.so.1) that models what the
// interposer's accounting depends on, so its real code paths run in CI:
// devices of a fixed capacity shared by every process (fake_gpu_state.h),
// CUDA_VISIBLE_DEVICES as indices or UUIDs, contexts and modules that cost
// memory, cuMemAlloc and friends, arrays, VMM handles with reference counts
// (create, map, retain, release, export/import), memory pools whose
// reservation grows in chunks and shrinks on trim or past the release
// threshold, graph memory, streams and events on a time-sliced device
// timeline (kernels take the time a test gives them), cuGetProcAddress with
// versions and per-thread-default-stream variants, and fault injection
// (FAKE_CUDA_FAIL=name:N fails the Nth call of `name` with out of memory;
// FAKE_CUDA_UNBOUND=1 answers cuGetProcAddress from the global scope).
// Built twice: as a current driver (13.0) and, with FAKE_CUDA_OLD, as an old
// one that lacks the VMM, pool and green-context entry points.
//
// Linked with -Bsymbolic-functions, as a real driver is: its own references
// (the table cuGetProcAddress answers from) never bind to an interposer's
// symbols.
#define __CUDA_API_VERSION_INTERNAL 1  // every variant under its own name
#include <cuda.h>
#include <dlfcn.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "fake_gpu_state.h"

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using fake_gpu::Lock;
using fake_gpu::Shared;

constexpr std::uint64_t kChunk = 32ull << 20;       // pools grow by this much
constexpr std::uint64_t kGranularity = 2ull << 20;  // VMM granularity
std::uint64_t ContextBytes() {
  return fake_gpu::EnvU64("FAKE_CUDA_CONTEXT_BYTES", 300ull << 20);
}
std::uint64_t ModuleBytes() {
  return fake_gpu::EnvU64("FAKE_CUDA_MODULE_BYTES", 2ull << 20);
}

std::uint64_t NowNs() {
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

// --- process-local model ------------------------------------------------------

struct Context {
  int physical;
  std::uint64_t cost;
  bool primary;
  std::uint64_t heap = 0, stack = 0;  // device memory of cuCtxSetLimit's heap and stacks
};
struct Allocation {
  int physical;
  std::uint64_t size;
  CUcontext ctx = nullptr;  // destroyed with it (pool allocations: none)
};
struct Handle {  // a VMM physical allocation
  int physical;
  std::uint64_t size;
  int refs;      // create/import/retain references plus mappings
  bool charged;  // imported handles are charged to their exporter
  std::uint64_t id;
};
struct Pool {
  int physical;
  std::uint64_t reserved = 0, used = 0, threshold = 0;
};
struct Graph {
  std::uint64_t mem_bytes = 0;
  int physical = 0;
  std::vector<CUgraphNode> nodes;  // its memory allocation nodes (the only kind the fake makes)
};
// A collective launched into a stream and not yet known to have ended.
struct PendingCollective {
  std::uint32_t group, peers;
  std::uint64_t seq, micros;
};
struct Stream {
  int physical;
  std::uint64_t end_ns = 0;
  std::vector<PendingCollective> pending;
  bool capturing = false;
  bool invalidated = false;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::uint64_t captured = 0;  // launches recorded into the capture
};
struct Event {
  std::uint64_t at_ns = 0;
  bool recorded = false;
  std::vector<PendingCollective> pending;  // what it also waits for
};
struct Module {
  int physical;
  std::uint64_t cost;
  CUcontext ctx = nullptr;
};
struct Function {
  std::uint64_t micros = 0;
  std::uint32_t group = 0, peers = 0;  // a collective when peers > 0
};

struct Model {
  std::mutex mu;
  bool initialised = false;
  std::vector<int> visible;  // ordinal -> physical
  std::map<CUcontext, Context> contexts;
  int primary_refs[fake_gpu::kMaxDevices] = {};
  CUcontext primary[fake_gpu::kMaxDevices] = {};
  std::map<CUdeviceptr, Allocation> allocations;
  std::map<CUdeviceptr, CUmemoryPool> pooled;  // async allocations and their pool
  std::map<CUarray, Allocation> arrays;
  std::map<CUmipmappedArray, Allocation> mipmapped;
  // Sparse and deferred-mapping arrays (CUarray or CUmipmappedArray): no
  // memory of their own; the size a deferred one would take, and what
  // cuMemMapArrayAsync mapped into each.
  struct Unbacked {
    std::uint64_t size = 0;
    bool deferred = false;
    std::vector<std::pair<std::array<std::uint64_t, 6>, CUmemGenericAllocationHandle>> maps;
  };
  std::map<void*, Unbacked> unbacked;
  std::map<CUmemGenericAllocationHandle, Handle> handles;
  std::map<CUdeviceptr, std::pair<CUmemGenericAllocationHandle, std::uint64_t>> mappings;
  std::map<CUmemoryPool, Pool> pools;
  CUmemoryPool default_pool[fake_gpu::kMaxDevices] = {};
  std::map<CUgraph, Graph> graphs;
  std::map<CUgraphNode, CUDA_MEM_ALLOC_NODE_PARAMS> mem_nodes;
  std::map<CUgraphExec, Graph> execs;
  std::uint64_t graph_reserved[fake_gpu::kMaxDevices] = {};
  std::uint64_t graph_in_use[fake_gpu::kMaxDevices] = {};
  // Graph launches with memory not yet ended (FAKE_CUDA_GRAPH_US > 0):
  // device, stream, memory, when they end.
  struct GraphRun {
    int physical;
    CUstream stream;
    std::uint64_t bytes, end_ns;
  };
  std::vector<GraphRun> graph_runs;
  std::map<CUstream, Stream> streams;
  std::map<CUevent, Event> events;
  std::map<CUmodule, Module> modules;
  std::map<CUfunction, Function> functions;
  std::uint64_t next_address = 0x7f0000000000ull;
  std::uintptr_t next_handle = 0x1000;
  std::map<std::string, long> calls;
};

Model& M() {
  static Model* m = new Model();
  return *m;
}

thread_local std::vector<CUcontext> tls_stack;

template <typename T>
T NewHandle() {
  return reinterpret_cast<T>(M().next_handle += 16);
}

// Fault injection: FAKE_CUDA_FAIL=name:N[,name:N] fails the Nth call.
bool Inject(const char* name) {
  const char* spec = std::getenv("FAKE_CUDA_FAIL");
  if (spec == nullptr) return false;
  const long n = ++M().calls[name];
  const std::string s(spec), key = std::string(name) + ":";
  for (std::size_t at = s.find(key); at != std::string::npos; at = s.find(key, at + 1)) {
    if (at > 0 && s[at - 1] != ',') continue;
    if (std::strtol(s.c_str() + at + key.size(), nullptr, 10) == n) return true;
  }
  return false;
}

// Physical bytes: charged to this process on the shared device, or refused.
CUresult ChargePhysical(int physical, std::uint64_t bytes) {
  Lock lock;
  if (fake_gpu::UsedOn(physical) + bytes > Shared()->capacity[physical]) return CUDA_ERROR_OUT_OF_MEMORY;
  fake_gpu::Self()->used[physical] += bytes;
  return CUDA_SUCCESS;
}
void UnchargePhysical(int physical, std::uint64_t bytes) {
  Lock lock;
  auto* self = fake_gpu::Self();
  self->used[physical] -= std::min(bytes, self->used[physical]);
}

CUcontext Current() {
  return tls_stack.empty() ? nullptr : tls_stack.back();
}

// The physical device of the current context, or -1.
int CurrentPhysical() {
  CUcontext c = Current();
  auto it = M().contexts.find(c);
  return it == M().contexts.end() ? -1 : it->second.physical;
}

CUresult Init() {
  Model& m = M();
  if (m.initialised) return CUDA_SUCCESS;
  const std::uint32_t n = Shared()->devices;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible == nullptr) {
    for (std::uint32_t d = 0; d < n; ++d) m.visible.push_back(static_cast<int>(d));
  } else {
    std::string list(visible);
    std::size_t start = 0;
    while (start <= list.size()) {
      const std::size_t comma = list.find(',', start);
      std::string item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      start = comma == std::string::npos ? list.size() + 1 : comma + 1;
      if (item.empty()) break;
      int found = -1;
      if (item.rfind("GPU-", 0) == 0) {
        for (std::uint32_t d = 0; d < n; ++d) {
          char uuid[64];
          const std::uint8_t* u = Shared()->uuid[d];
          std::snprintf(uuid, sizeof(uuid), "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                        u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14],
                        u[15]);
          if (std::string_view(uuid).rfind(item, 0) == 0) found = static_cast<int>(d);
        }
      } else {
        char* end = nullptr;
        const long d = std::strtol(item.c_str(), &end, 10);
        if (*end == '\0' && d >= 0 && d < static_cast<long>(n)) found = static_cast<int>(d);
      }
      if (found < 0) break;  // as CUDA: the list stops at the first invalid entry
      m.visible.push_back(found);
    }
  }
  m.initialised = true;
  return CUDA_SUCCESS;
}

#define REQUIRE_INIT()                                       \
  do {                                                       \
    if (!M().initialised) return CUDA_ERROR_NOT_INITIALIZED; \
  } while (0)

int Physical(CUdevice ordinal) {
  if (ordinal < 0 || ordinal >= static_cast<int>(M().visible.size())) return -1;
  return M().visible[static_cast<std::size_t>(ordinal)];
}

CUresult NewContext(CUcontext* out, CUdevice dev, bool primary) {
  const int p = Physical(dev);
  if (p < 0) return CUDA_ERROR_INVALID_DEVICE;
  if (Inject("context")) return CUDA_ERROR_OUT_OF_MEMORY;
  const std::uint64_t cost = ContextBytes();
  if (ChargePhysical(p, cost) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
  // FAKE_CUDA_NEIGHBOUR_BYTES: another process's allocation lands on the
  // device while this context is made (charged to the parent process).
  if (const std::uint64_t neighbour = fake_gpu::EnvU64("FAKE_CUDA_NEIGHBOUR_BYTES", 0); neighbour > 0) {
    fake_gpu::Lock lock;
    fake_gpu::Other(static_cast<std::int32_t>(::getppid()))->used[p] += neighbour;
  }
  CUcontext c = NewHandle<CUcontext>();
  M().contexts[c] = {p, cost, primary};
  *out = c;
  return CUDA_SUCCESS;
}

// A context's end frees what was allocated in it, as a real driver does.
void DestroyContext(CUcontext c) {
  auto it = M().contexts.find(c);
  if (it == M().contexts.end()) return;
  UnchargePhysical(it->second.physical, it->second.cost + it->second.heap + it->second.stack);
  M().contexts.erase(it);
  auto drop = [c](auto& table, auto cost) {
    for (auto e = table.begin(); e != table.end();) {
      if (e->second.ctx == c) {
        UnchargePhysical(e->second.physical, cost(e->second));
        e = table.erase(e);
      } else {
        ++e;
      }
    }
  };
  drop(M().allocations, [](const Allocation& a) { return a.size; });
  drop(M().arrays, [](const Allocation& a) { return a.size; });
  drop(M().mipmapped, [](const Allocation& a) { return a.size; });
  drop(M().modules, [](const Module& m) { return m.cost; });
  for (auto& s : tls_stack)
    if (s == c) s = nullptr;
}

CUresult AllocPlain(CUdeviceptr* p, std::uint64_t size, const char* name) {
  REQUIRE_INIT();
  if (p == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  const int dev = CurrentPhysical();
  if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (Inject(name) || ChargePhysical(dev, size) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
  *p = M().next_address;
  M().next_address += (size + 0xFFFF) & ~0xFFFFull;
  M().allocations[*p] = {dev, size, Current()};
  return CUDA_SUCCESS;
}

std::uint64_t ElementBytes(CUarray_format f) {
  switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 2;
    default:
      return 4;
  }
}

// What an array takes: its elements, rounded up to 64 KiB (arrays are tiled).
std::uint64_t ArrayBytes(std::uint64_t w, std::uint64_t h, std::uint64_t d, CUarray_format f, unsigned channels) {
  const std::uint64_t raw =
      w * std::max<std::uint64_t>(h, 1) * std::max<std::uint64_t>(d, 1) * channels * ElementBytes(f);
  return (raw + 0xFFFF) & ~0xFFFFull;
}

CUresult PoolAlloc(CUdeviceptr* p, std::uint64_t size, CUmemoryPool pool, CUstream stream) {
  (void)stream;
  auto it = M().pools.find(pool);
  if (it == M().pools.end()) return CUDA_ERROR_INVALID_VALUE;
  Pool& pl = it->second;
  if (Inject("cuMemAllocAsync")) return CUDA_ERROR_OUT_OF_MEMORY;
  if (pl.used + size > pl.reserved) {
    const std::uint64_t grow = (pl.used + size - pl.reserved + kChunk - 1) / kChunk * kChunk;
    if (ChargePhysical(pl.physical, grow) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
    pl.reserved += grow;
  }
  pl.used += size;
  *p = M().next_address;
  M().next_address += (size + 0xFFFF) & ~0xFFFFull;
  M().allocations[*p] = {pl.physical, size};
  M().pooled[*p] = pool;
  return CUDA_SUCCESS;
}

// Memory beyond the release threshold goes back (whole chunks).
void PoolRelease(Pool& pl, std::uint64_t keep) {
  const std::uint64_t floor = std::max(pl.used, keep);
  if (pl.reserved <= floor) return;
  const std::uint64_t excess = (pl.reserved - floor) / kChunk * kChunk;
  pl.reserved -= excess;
  UnchargePhysical(pl.physical, excess);
}

CUmemoryPool DefaultPool(int physical) {
  Model& m = M();
  if (m.default_pool[physical] == nullptr) {
    CUmemoryPool p = NewHandle<CUmemoryPool>();
    m.pools[p].physical = physical;
    m.default_pool[physical] = p;
  }
  return m.default_pool[physical];
}

constexpr std::uint64_t kNever = ~std::uint64_t{0};

// When the collectives in `pending` end (kNever while a peer has not yet
// launched its part); those that have ended leave `pending`.
std::uint64_t Resolve(std::vector<PendingCollective>* pending) {
  std::uint64_t end = 0;
  Lock lock;
  std::erase_if(*pending, [&](const PendingCollective& p) {
    const auto& c = Shared()->collectives[p.group % 8][p.seq % 64];
    if (c.seq != p.seq || c.arrived < p.peers) {
      end = kNever;
      return false;
    }
    if (end != kNever) end = std::max(end, c.last_start_ns + p.micros * 1000);
    return true;
  });
  return end;
}

std::uint64_t StreamEnd(CUstream s) {
  auto it = M().streams.find(s);
  if (it == M().streams.end()) return 0;
  const std::uint64_t collectives = Resolve(&it->second.pending);
  if (collectives == kNever) return kNever;
  it->second.end_ns = std::max(it->second.end_ns, collectives);
  return it->second.end_ns;
}

// The capture mode of this thread (cuThreadExchangeStreamCaptureMode).
thread_local CUstreamCaptureMode tls_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

// A call that is unsafe during capture (synchronising, querying) from a
// thread not in relaxed mode invalidates every global-mode capture in the
// process, as the driver does.
void UnsafeDuringCapture() {
  if (tls_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return;
  for (auto& [handle, st] : M().streams)
    if (st.capturing && st.mode == CU_STREAM_CAPTURE_MODE_GLOBAL) st.invalidated = true;
}

// A kernel of `micros` on the device's shared timeline (time-sliced).
CUresult Launch(CUfunction f, CUstream stream) {
  REQUIRE_INIT();
  const int dev = CurrentPhysical();
  if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
  const Function fn = M().functions.count(f) ? M().functions[f] : Function{};
  const std::uint64_t micros = fn.micros;
  Stream& s = M().streams[stream];
  s.physical = dev;
  if (s.capturing) {  // recorded into the graph, not run
    ++s.captured;
    return CUDA_SUCCESS;
  }
  std::uint64_t start = std::max(NowNs(), s.end_ns);
  if (fn.peers > 0) {
    // Spins on the device (time-sliced with others) until its peers arrive.
    static thread_local std::map<std::uint32_t, std::uint64_t> next_seq;
    const std::uint64_t seq = ++next_seq[fn.group];
    {
      Lock lock;
      auto& c = Shared()->collectives[fn.group % 8][seq % 64];
      if (c.seq != seq) c = {seq, 0, 0};
      ++c.arrived;
      c.last_start_ns = std::max(c.last_start_ns, start);
    }
    s.pending.push_back({fn.group, fn.peers, seq, micros});
    return CUDA_SUCCESS;
  }
  // FAKE_CUDA_LAUNCH_BYTES: memory the driver takes at a process's first
  // launch on a device (local memory, lazily loaded kernels) through no
  // call the interposer sees; NVML's per-process figure shows it.
  static std::atomic<std::uint32_t> launched_on{0};
  if (!(launched_on.fetch_or(1u << dev) & (1u << dev))) {
    if (const std::uint64_t bytes = fake_gpu::EnvU64("FAKE_CUDA_LAUNCH_BYTES", 0); bytes > 0)
      (void)ChargePhysical(dev, bytes);
  }
  {
    Lock lock;
    start = std::max(start, Shared()->busy_until_ns[dev]);
    Shared()->busy_until_ns[dev] = start + micros * 1000;
  }
  s.end_ns = start + micros * 1000;
  return CUDA_SUCCESS;
}

void SleepUntil(std::uint64_t ns) {
  const std::uint64_t now = NowNs();
  if (ns > now) std::this_thread::sleep_for(std::chrono::nanoseconds(ns - now));
}

}  // namespace

// --- the exported driver API ---------------------------------------------------

#define LOCKED std::lock_guard<std::mutex> guard(M().mu)

FAKE_EXPORT CUresult cuInit(unsigned int) {
  LOCKED;
  return Init();
}
FAKE_EXPORT CUresult cuDriverGetVersion(int* v) {
#if defined(FAKE_CUDA_OLD)
  *v = 10010;
#else
  *v = static_cast<int>(fake_gpu::EnvU64("FAKE_CUDA_DRIVER_VERSION", 13000));
#endif
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGetCount(int* n) {
  LOCKED;
  REQUIRE_INIT();
  *n = static_cast<int>(M().visible.size());
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  LOCKED;
  REQUIRE_INIT();
  if (Physical(ordinal) < 0) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  LOCKED;
  if (Physical(d) < 0) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<std::size_t>(len), "Fake GPU %d", Physical(d));
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGetPCIBusId(char* bus_id, int len, CUdevice d) {
  LOCKED;
  if (Physical(d) < 0 || bus_id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(bus_id, static_cast<std::size_t>(len), "0000:%02X:00.0", 0x17 + Physical(d));
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice d) {
  LOCKED;
  const int p = Physical(d);
  if (p < 0) return CUDA_ERROR_INVALID_DEVICE;
  std::memcpy(uuid->bytes, Shared()->uuid[p], 16);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice d) {
  return cuDeviceGetUuid(uuid, d);
}
FAKE_EXPORT CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
  LOCKED;
  if (Physical(d) < 0) return CUDA_ERROR_INVALID_DEVICE;
  *v = a == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT ? 132 : 1;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
  LOCKED;
  const int p = Physical(d);
  if (p < 0) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = Shared()->capacity[p];
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceTotalMem(unsigned int* bytes, CUdevice d) {
  size_t b = 0;
  CUresult r = cuDeviceTotalMem_v2(&b, d);
  if (r == CUDA_SUCCESS) *bytes = static_cast<unsigned int>(std::min<size_t>(b, 0xFFFFFFFFu));
  return r;
}

// Contexts.
FAKE_EXPORT CUresult cuCtxCreate_v2(CUcontext* c, unsigned int, CUdevice d) {
  LOCKED;
  REQUIRE_INIT();
  CUresult r = NewContext(c, d, false);
  if (r == CUDA_SUCCESS) tls_stack.push_back(*c);
  return r;
}
FAKE_EXPORT
CUresult cuCtxCreate_v3(CUcontext* c, CUexecAffinityParam*, int, unsigned int f, CUdevice d) {
  return cuCtxCreate_v2(c, f, d);
}
FAKE_EXPORT CUresult cuCtxCreate_v4(CUcontext* c, CUctxCreateParams*, unsigned int f, CUdevice d) {
  return cuCtxCreate_v2(c, f, d);
}
FAKE_EXPORT CUresult cuCtxCreate(CUcontext* c, unsigned int f, CUdevice d) {
  return cuCtxCreate_v2(c, f, d);
}
FAKE_EXPORT CUresult cuCtxDestroy_v2(CUcontext c) {
  LOCKED;
  if (!M().contexts.count(c) || M().contexts[c].primary) return CUDA_ERROR_INVALID_CONTEXT;
  DestroyContext(c);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuCtxDestroy(CUcontext c) {
  return cuCtxDestroy_v2(c);
}
FAKE_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
  LOCKED;
  REQUIRE_INIT();
  const int p = Physical(d);
  if (p < 0) return CUDA_ERROR_INVALID_DEVICE;
  Model& m = M();
  if (m.primary_refs[p] == 0) {
    CUresult r = NewContext(&m.primary[p], d, true);
    if (r != CUDA_SUCCESS) return r;
  }
  ++m.primary_refs[p];
  *c = m.primary[p];
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  LOCKED;
  const int p = Physical(d);
  if (p < 0 || M().primary_refs[p] == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--M().primary_refs[p] == 0) {
    DestroyContext(M().primary[p]);
    M().primary[p] = nullptr;
  }
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d) {
  return cuDevicePrimaryCtxRelease_v2(d);
}
FAKE_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) {
  LOCKED;
  const int p = Physical(d);
  if (p < 0) return CUDA_ERROR_INVALID_DEVICE;
  if (M().primary_refs[p] > 0) {
    DestroyContext(M().primary[p]);  // everything allocated in it goes with it
    M().primary[p] = nullptr;
    M().primary_refs[p] = 0;
  }
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice d) {
  return cuDevicePrimaryCtxReset_v2(d);
}
FAKE_EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
  if (tls_stack.empty()) {
    tls_stack.push_back(c);
  } else {
    tls_stack.back() = c;
  }
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuCtxGetCurrent(CUcontext* c) {
  *c = Current();
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c) {
  tls_stack.push_back(c);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* c) {
  if (tls_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (c) *c = tls_stack.back();
  tls_stack.pop_back();
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuCtxGetDevice(CUdevice* d) {
  LOCKED;
  const int p = CurrentPhysical();
  if (p < 0) return CUDA_ERROR_INVALID_CONTEXT;
  for (std::size_t o = 0; o < M().visible.size(); ++o)
    if (M().visible[o] == p) *d = static_cast<CUdevice>(o);
  return CUDA_SUCCESS;
}
// The malloc heap takes its size; stacks take the size per thread for
// 2,048 resident threads; the printf FIFO its size.
FAKE_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
  LOCKED;
  auto it = M().contexts.find(Current());
  if (it == M().contexts.end()) return CUDA_ERROR_INVALID_CONTEXT;
  Context& c = it->second;
  std::uint64_t* slot = limit == CU_LIMIT_MALLOC_HEAP_SIZE ? &c.heap
                        : limit == CU_LIMIT_STACK_SIZE     ? &c.stack
                                                           : nullptr;
  if (slot == nullptr) return CUDA_SUCCESS;
  const std::uint64_t bytes = limit == CU_LIMIT_STACK_SIZE ? std::uint64_t{value} * 2048 : value;
  if (bytes > *slot && ChargePhysical(c.physical, bytes - *slot) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
  if (bytes < *slot) UnchargePhysical(c.physical, *slot - bytes);
  *slot = bytes;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxSynchronize() {
  for (;;) {
    std::uint64_t until = 0;
    {
      LOCKED;
      UnsafeDuringCapture();
      for (auto& [s, st] : M().streams) until = std::max(until, StreamEnd(s));
    }
    if (until != kNever) {
      SleepUntil(until);
      return CUDA_SUCCESS;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // a collective waits for its peers
  }
}

// Memory.
FAKE_EXPORT CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total) {
  LOCKED;
  REQUIRE_INIT();
  const int p = CurrentPhysical();
  if (p < 0) return CUDA_ERROR_INVALID_CONTEXT;
  Lock lock;
  const std::uint64_t cap = Shared()->capacity[p], used = fake_gpu::UsedOn(p);
  *free_bytes = cap > used ? cap - used : 0;
  *total = cap;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemGetInfo(unsigned int* f, unsigned int* t) {
  size_t a = 0, b = 0;
  CUresult r = cuMemGetInfo_v2(&a, &b);
  if (r == CUDA_SUCCESS) {
    *f = static_cast<unsigned int>(std::min<size_t>(a, 0xFFFFFFFFu));
    *t = static_cast<unsigned int>(std::min<size_t>(b, 0xFFFFFFFFu));
  }
  return r;
}
FAKE_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t size) {
  LOCKED;
  return AllocPlain(p, size, "cuMemAlloc");
}
FAKE_EXPORT CUresult cuMemAlloc(unsigned int* p, unsigned int size) {
  CUdeviceptr q = 0;
  CUresult r = cuMemAlloc_v2(&q, size);
  if (r == CUDA_SUCCESS) *p = static_cast<unsigned int>(q);
  return r;
}
FAKE_EXPORT
CUresult cuMemAllocPitch_v2(CUdeviceptr* p, size_t* pitch, size_t width, size_t height, unsigned int) {
  LOCKED;
  const std::size_t aligned = (width + 511) & ~std::size_t{511};
  CUresult r = AllocPlain(p, aligned * height, "cuMemAllocPitch");
  if (r == CUDA_SUCCESS) *pitch = aligned;
  return r;
}
FAKE_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* p, size_t size, unsigned int) {
  LOCKED;
  return AllocPlain(p, size, "cuMemAllocManaged");
}
FAKE_EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
  LOCKED;
  auto it = M().allocations.find(p);
  if (it == M().allocations.end() || M().pooled.count(p)) return CUDA_ERROR_INVALID_VALUE;
  UnchargePhysical(it->second.physical, it->second.size);
  M().allocations.erase(it);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemFree(unsigned int p) {
  return cuMemFree_v2(p);
}
FAKE_EXPORT CUresult cuMemAllocHost_v2(void** p, size_t size) {
  *p = std::malloc(size ? size : 1);  // host memory: never charged to a device
  return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
FAKE_EXPORT CUresult cuMemFreeHost(void* p) {
  std::free(p);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
  LOCKED;
  for (const auto& [a, alloc] : M().allocations)
    if (p >= a && p < a + alloc.size) {
      if (base) *base = a;
      if (size) *size = alloc.size;
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_NOT_FOUND;
}

#if !defined(FAKE_CUDA_OLD)
void DropReference(CUmemGenericAllocationHandle h);
#endif

// Arrays. As the real driver: cuArrayGetMemoryRequirements answers only
// for arrays made with CUDA_ARRAY3D_DEFERRED_MAPPING; those and sparse ones
// take no memory until a handle is mapped into them (cuMemMapArrayAsync).
constexpr unsigned kUnbackedFlags = CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING;

template <typename Handle>
CUresult CreateArray(Handle* a, std::map<Handle, Allocation>& table, std::uint64_t bytes, unsigned flags) {
  REQUIRE_INIT();
  const int dev = CurrentPhysical();
  if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
  const bool unbacked = flags & kUnbackedFlags;
  if (!unbacked && (Inject("cuArrayCreate") || ChargePhysical(dev, bytes) != CUDA_SUCCESS))
    return CUDA_ERROR_OUT_OF_MEMORY;
  *a = NewHandle<Handle>();
  table[*a] = {dev, unbacked ? 0 : bytes, Current()};
  if (unbacked) M().unbacked[*a] = {bytes, (flags & CUDA_ARRAY3D_DEFERRED_MAPPING) != 0, {}};
  return CUDA_SUCCESS;
}
template <typename Handle>
CUresult DestroyArray(Handle a, std::map<Handle, Allocation>& table) {
  auto it = table.find(a);
  if (it == table.end()) return CUDA_ERROR_INVALID_HANDLE;
  UnchargePhysical(it->second.physical, it->second.size);
  table.erase(it);
  if (auto u = M().unbacked.find(a); u != M().unbacked.end()) {
#if !defined(FAKE_CUDA_OLD)
    for (const auto& [key, handle] : u->second.maps) DropReference(handle);
#endif
    M().unbacked.erase(u);
  }
  return CUDA_SUCCESS;
}
CUresult Requirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* req, void* a) {
  auto it = M().unbacked.find(a);
  if (it == M().unbacked.end() || !it->second.deferred) return CUDA_ERROR_INVALID_VALUE;
  req->size = it->second.size;
  req->alignment = 0x10000;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuArrayCreate_v2(CUarray* a, const CUDA_ARRAY_DESCRIPTOR* d) {
  LOCKED;
  return CreateArray(a, M().arrays, ArrayBytes(d->Width, d->Height, 1, d->Format, d->NumChannels), 0);
}
FAKE_EXPORT CUresult cuArray3DCreate_v2(CUarray* a, const CUDA_ARRAY3D_DESCRIPTOR* d) {
  LOCKED;
  return CreateArray(a, M().arrays, ArrayBytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels), d->Flags);
}
FAKE_EXPORT CUresult cuArrayDestroy(CUarray a) {
  LOCKED;
  return DestroyArray(a, M().arrays);
}
FAKE_EXPORT
CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* req, CUarray a, CUdevice) {
  LOCKED;
  if (!M().arrays.count(a)) return CUDA_ERROR_INVALID_HANDLE;
  return Requirements(req, a);
}
FAKE_EXPORT
CUresult cuMipmappedArrayCreate(CUmipmappedArray* a, const CUDA_ARRAY3D_DESCRIPTOR* d, unsigned int levels) {
  LOCKED;
  std::uint64_t bytes = 0, w = d->Width, h = d->Height, z = d->Depth;
  for (unsigned l = 0; l < levels; ++l) {
    bytes += ArrayBytes(w, h, z, d->Format, d->NumChannels);
    w = std::max<std::uint64_t>(1, w / 2), h = h ? std::max<std::uint64_t>(1, h / 2) : 0,
    z = z ? std::max<std::uint64_t>(1, z / 2) : 0;
  }
  return CreateArray(a, M().mipmapped, bytes, d->Flags);
}
FAKE_EXPORT
CUresult cuMipmappedArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* req, CUmipmappedArray a, CUdevice) {
  LOCKED;
  if (!M().mipmapped.count(a)) return CUDA_ERROR_INVALID_HANDLE;
  return Requirements(req, a);
}
FAKE_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) {
  LOCKED;
  return DestroyArray(a, M().mipmapped);
}

// Modules and kernels.
CUresult LoadModule(CUmodule* m) {
  LOCKED;
  REQUIRE_INIT();
  const int dev = CurrentPhysical();
  if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (ChargePhysical(dev, ModuleBytes()) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
  *m = NewHandle<CUmodule>();
  M().modules[*m] = {dev, ModuleBytes(), Current()};
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuModuleLoad(CUmodule* m, const char*) {
  return LoadModule(m);
}
FAKE_EXPORT CUresult cuModuleLoadData(CUmodule* m, const void*) {
  return LoadModule(m);
}
FAKE_EXPORT
CUresult cuModuleLoadDataEx(CUmodule* m, const void*, unsigned int, CUjit_option*, void**) {
  return LoadModule(m);
}
FAKE_EXPORT CUresult cuModuleLoadFatBinary(CUmodule* m, const void*) {
  return LoadModule(m);
}
FAKE_EXPORT CUresult cuModuleUnload(CUmodule m) {
  LOCKED;
  auto it = M().modules.find(m);
  if (it == M().modules.end()) return CUDA_ERROR_INVALID_HANDLE;
  UnchargePhysical(it->second.physical, it->second.cost);
  M().modules.erase(it);
  return CUDA_SUCCESS;
}
// Libraries (CUDA 12): loaded into the current context here.
FAKE_EXPORT
CUresult cuLibraryLoadData(CUlibrary* l, const void*, CUjit_option*, void**, unsigned int, CUlibraryOption*, void**,
                           unsigned int) {
  return LoadModule(reinterpret_cast<CUmodule*>(l));
}
FAKE_EXPORT
CUresult cuLibraryLoadFromFile(CUlibrary* l, const char*, CUjit_option*, void**, unsigned int, CUlibraryOption*, void**,
                               unsigned int) {
  return LoadModule(reinterpret_cast<CUmodule*>(l));
}
FAKE_EXPORT CUresult cuLibraryUnload(CUlibrary l) {
  return cuModuleUnload(reinterpret_cast<CUmodule>(l));
}
FAKE_EXPORT CUresult cuModuleGetFunction(CUfunction* f, CUmodule, const char* name) {
  LOCKED;
  *f = NewHandle<CUfunction>();
  // "spin_<micros>" names a kernel that takes that long.
  unsigned long micros = 0;
  unsigned group = 0, peers = 0;
  if (name && std::sscanf(name, "spin_%lu", &micros) == 1) M().functions[*f].micros = micros;
  if (name && std::sscanf(name, "allreduce_%u_%u_%lu", &group, &peers, &micros) == 3)
    M().functions[*f] = {micros, group, peers};
  M().functions[*f];
  return CUDA_SUCCESS;
}
#define FAKE_LAUNCH(fn)                                                                                               \
  FAKE_EXPORT                                                                                                         \
  CUresult fn(CUfunction f, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream s, void**, \
              void**) {                                                                                               \
    LOCKED;                                                                                                           \
    return Launch(f, s);                                                                                              \
  }
FAKE_LAUNCH(cuLaunchKernel)
FAKE_LAUNCH(cuLaunchKernel_ptsz)
#define FAKE_COOPERATIVE(fn)                                                                                  \
  FAKE_EXPORT                                                                                                 \
  CUresult fn(CUfunction f, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream s, \
              void**) {                                                                                       \
    LOCKED;                                                                                                   \
    return Launch(f, s);                                                                                      \
  }
FAKE_COOPERATIVE(cuLaunchCooperativeKernel)
FAKE_COOPERATIVE(cuLaunchCooperativeKernel_ptsz)
FAKE_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction f, void**, void**) {
  LOCKED;
  return Launch(f, c->hStream);
}
FAKE_EXPORT
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* c, CUfunction f, void** a, void** b) {
  return cuLaunchKernelEx(c, f, a, b);
}

// Streams and events: a kernel's time on the device timeline.
FAKE_EXPORT CUresult cuStreamCreate(CUstream* s, unsigned int) {
  LOCKED;
  *s = NewHandle<CUstream>();
  M().streams[*s].physical = std::max(0, CurrentPhysical());
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
  LOCKED;
  M().streams.erase(s);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuStreamSynchronize(CUstream s) {
  for (;;) {
    std::uint64_t until;
    {
      LOCKED;
      if (s == nullptr) UnsafeDuringCapture();
      until = StreamEnd(s);
    }
    if (until != kNever) {
      SleepUntil(until);
      return CUDA_SUCCESS;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}
FAKE_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) {
  return cuStreamSynchronize(s);
}
FAKE_EXPORT CUresult cuEventCreate(CUevent* e, unsigned int) {
  LOCKED;
  *e = NewHandle<CUevent>();
  M().events[*e];
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventDestroy_v2(CUevent e) {
  LOCKED;
  M().events.erase(e);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
  LOCKED;
  Event& ev = M().events[e];
  const std::uint64_t end = StreamEnd(s);
  auto it = M().streams.find(s);
  ev.pending = it == M().streams.end() ? std::vector<PendingCollective>{} : it->second.pending;
  ev.at_ns = std::max(NowNs(), it == M().streams.end() ? 0 : it->second.end_ns);
  (void)end;
  ev.recorded = true;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventRecord_ptsz(CUevent e, CUstream s) {
  return cuEventRecord(e, s);
}
// When event `e` completes (kNever while a collective before it waits).
std::uint64_t EventAt(Event& ev) {
  const std::uint64_t collectives = Resolve(&ev.pending);
  if (collectives == kNever) return kNever;
  ev.at_ns = std::max(ev.at_ns, collectives);
  return ev.at_ns;
}
FAKE_EXPORT CUresult cuEventQuery(CUevent e) {
  LOCKED;
  UnsafeDuringCapture();
  return NowNs() >= EventAt(M().events[e]) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
FAKE_EXPORT CUresult cuEventSynchronize(CUevent e) {
  for (;;) {
    std::uint64_t at;
    {
      LOCKED;
      at = EventAt(M().events[e]);
    }
    if (at != kNever) {
      SleepUntil(at);
      return CUDA_SUCCESS;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// Stream capture: launches into a capturing stream are recorded, not run.
FAKE_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
  LOCKED;
  Stream& st = M().streams[s];
  if (st.capturing) return CUDA_ERROR_ILLEGAL_STATE;
  st.capturing = true;
  st.invalidated = false;
  st.mode = mode;
  st.captured = 0;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph* graph) {
  LOCKED;
  Stream& st = M().streams[s];
  if (!st.capturing) return CUDA_ERROR_ILLEGAL_STATE;
  st.capturing = false;
  if (st.invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  *graph = NewHandle<CUgraph>();
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* status) {
  LOCKED;
  auto it = M().streams.find(s);
  *status = it == M().streams.end() || !it->second.capturing ? CU_STREAM_CAPTURE_STATUS_NONE
            : it->second.invalidated                         ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                                             : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  const CUstreamCaptureMode previous = tls_capture_mode;
  tls_capture_mode = *mode;
  *mode = previous;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventElapsedTime_v2(float* ms, CUevent a, CUevent b) {
  LOCKED;
  *ms = static_cast<float>(static_cast<double>(M().events[b].at_ns - M().events[a].at_ns) / 1e6);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventElapsedTime(float* ms, CUevent a, CUevent b) {
  return cuEventElapsedTime_v2(ms, a, b);
}

#if !defined(FAKE_CUDA_OLD)
// VMM.
FAKE_EXPORT
CUresult cuMemGetAllocationGranularity(size_t* g, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) {
  *g = kGranularity;
  return CUDA_SUCCESS;
}
FAKE_EXPORT
CUresult cuMemCreate(CUmemGenericAllocationHandle* h, size_t size, const CUmemAllocationProp* prop,
                     unsigned long long) {
  LOCKED;
  REQUIRE_INIT();
  if (prop == nullptr || size % kGranularity != 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    // Host-located (pinned) memory: no device memory taken.
    *h = static_cast<CUmemGenericAllocationHandle>(M().next_handle += 16);
    M().handles[*h] = {-1, size, 1, false, *h};
    return CUDA_SUCCESS;
  }
  const int p = Physical(prop->location.id);
  if (p < 0) return CUDA_ERROR_INVALID_DEVICE;
  if (Inject("cuMemCreate") || ChargePhysical(p, size) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
  *h = static_cast<CUmemGenericAllocationHandle>(M().next_handle += 16);
  M().handles[*h] = {p, size, 1, true, *h};
  return CUDA_SUCCESS;
}
void DropReference(CUmemGenericAllocationHandle h) {
  auto it = M().handles.find(h);
  if (it == M().handles.end()) return;
  if (--it->second.refs > 0) return;
  if (it->second.charged && it->second.physical >= 0) UnchargePhysical(it->second.physical, it->second.size);
  M().handles.erase(it);
}
FAKE_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  LOCKED;
  if (!M().handles.count(h)) return CUDA_ERROR_INVALID_VALUE;
  DropReference(h);
  return CUDA_SUCCESS;
}
FAKE_EXPORT
CUresult cuMemAddressReserve(CUdeviceptr* p, size_t size, size_t, CUdeviceptr, unsigned long long) {
  LOCKED;
  *p = M().next_address;
  M().next_address += (size + kGranularity - 1) & ~(kGranularity - 1);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemAddressFree(CUdeviceptr, size_t) {
  return CUDA_SUCCESS;
}
FAKE_EXPORT
CUresult cuMemMap(CUdeviceptr p, size_t size, size_t, CUmemGenericAllocationHandle h, unsigned long long) {
  LOCKED;
  auto it = M().handles.find(h);
  if (it == M().handles.end()) return CUDA_ERROR_INVALID_VALUE;
  ++it->second.refs;
  M().mappings[p] = {h, size};
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
  LOCKED;
  // Every mapping inside [p, p + size) goes.
  for (auto it = M().mappings.lower_bound(p); it != M().mappings.end() && it->first < p + size;) {
    DropReference(it->second.first);
    it = M().mappings.erase(it);
  }
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) {
  return CUDA_SUCCESS;
}
FAKE_EXPORT
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* h, void* addr) {
  LOCKED;
  const auto p = reinterpret_cast<CUdeviceptr>(addr);
  for (auto& [va, m] : M().mappings)
    if (p >= va && p < va + m.second) {
      ++M().handles[m.first].refs;
      *h = m.first;
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_INVALID_VALUE;
}
FAKE_EXPORT
CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop, CUmemGenericAllocationHandle h) {
  LOCKED;
  auto it = M().handles.find(h);
  if (it == M().handles.end()) return CUDA_ERROR_INVALID_VALUE;
  std::memset(prop, 0, sizeof(*prop));
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = it->second.physical >= 0 ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST;
  for (std::size_t o = 0; o < M().visible.size(); ++o)
    if (M().visible[o] == it->second.physical) prop->location.id = static_cast<int>(o);
  return CUDA_SUCCESS;
}
FAKE_EXPORT
CUresult cuMemExportToShareableHandle(void* out, CUmemGenericAllocationHandle h, CUmemAllocationHandleType,
                                      unsigned long long) {
  LOCKED;
  if (!M().handles.count(h)) return CUDA_ERROR_INVALID_VALUE;
  *static_cast<int*>(out) = static_cast<int>(h);
  return CUDA_SUCCESS;
}
FAKE_EXPORT
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* h, void* shared, CUmemAllocationHandleType) {
  LOCKED;
  // Within one process (the tests): the same memory under a new reference.
  const auto id = static_cast<std::uintptr_t>(reinterpret_cast<std::intptr_t>(shared));
  for (auto& [handle, e] : M().handles)
    if (handle == id) {
      ++e.refs;
      *h = handle;
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_INVALID_VALUE;
}
// Sparse arrays: maps handles into (or unmaps them from) the tiles of a
// sparse or deferred-mapping array; a mapping holds a reference to its
// handle, as cuMemMap's do.
std::array<std::uint64_t, 6> MapKey(const CUarrayMapInfo& m) {
  if (m.subresourceType == CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL)
    return {1, m.subresource.miptail.layer, m.subresource.miptail.offset, 0, 0, 0};
  const auto& l = m.subresource.sparseLevel;
  return {0, l.layer, l.level, l.offsetX, l.offsetY, l.offsetZ};
}
CUresult MapArray(CUarrayMapInfo* list, unsigned int count) {
  LOCKED;
  for (unsigned i = 0; i < count; ++i) {
    const CUarrayMapInfo& m = list[i];
    void* resource = m.resourceType == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY ? static_cast<void*>(m.resource.mipmap)
                                                                        : static_cast<void*>(m.resource.array);
    auto u = M().unbacked.find(resource);
    if (u == M().unbacked.end()) return CUDA_ERROR_INVALID_VALUE;  // not sparse or deferred
    auto& maps = u->second.maps;
    const auto key = MapKey(m);
    auto at = std::find_if(maps.begin(), maps.end(), [&](const auto& e) { return e.first == key; });
    if (m.memOperationType == CU_MEM_OPERATION_TYPE_MAP) {
      auto h = M().handles.find(m.memHandle.memHandle);
      if (m.memHandleType != CU_MEM_HANDLE_TYPE_GENERIC || h == M().handles.end()) return CUDA_ERROR_INVALID_VALUE;
      ++h->second.refs;
      if (at != maps.end()) {
        DropReference(at->second);
        at->second = m.memHandle.memHandle;
      } else {
        maps.push_back({key, m.memHandle.memHandle});
      }
    } else if (m.memOperationType == CU_MEM_OPERATION_TYPE_UNMAP && at != maps.end()) {
      DropReference(at->second);
      maps.erase(at);
    }
  }
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemMapArrayAsync(CUarrayMapInfo* list, unsigned int count, CUstream) {
  return MapArray(list, count);
}
FAKE_EXPORT CUresult cuMemMapArrayAsync_ptsz(CUarrayMapInfo* list, unsigned int count, CUstream) {
  return MapArray(list, count);
}

// Pools.
FAKE_EXPORT CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  LOCKED;
  REQUIRE_INIT();
  const int p = Physical(props->location.id);
  if (p < 0) return CUDA_ERROR_INVALID_DEVICE;
  *pool = NewHandle<CUmemoryPool>();
  M().pools[*pool].physical = p;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  LOCKED;
  auto it = M().pools.find(pool);
  if (it == M().pools.end()) return CUDA_ERROR_INVALID_VALUE;
  UnchargePhysical(it->second.physical, it->second.reserved);
  for (auto a = M().pooled.begin(); a != M().pooled.end();) {
    if (a->second == pool) {
      M().allocations.erase(a->first);
      a = M().pooled.erase(a);
    } else {
      ++a;
    }
  }
  M().pools.erase(it);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice d) {
  LOCKED;
  const int p = Physical(d);
  if (p < 0) return CUDA_ERROR_INVALID_DEVICE;
  *pool = DefaultPool(p);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice d) {
  return cuDeviceGetDefaultMemPool(pool, d);
}
FAKE_EXPORT
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  LOCKED;
  auto it = M().pools.find(pool);
  if (it == M().pools.end()) return CUDA_ERROR_INVALID_VALUE;
  auto* v = static_cast<cuuint64_t*>(value);
  switch (attr) {
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
      *v = it->second.reserved;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
      *v = it->second.used;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      *v = it->second.threshold;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}
FAKE_EXPORT
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  LOCKED;
  auto it = M().pools.find(pool);
  if (it == M().pools.end()) return CUDA_ERROR_INVALID_VALUE;
  if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) {
    it->second.threshold = *static_cast<cuuint64_t*>(value);
    PoolRelease(it->second, it->second.threshold);
  }
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
  LOCKED;
  auto it = M().pools.find(pool);
  if (it == M().pools.end()) return CUDA_ERROR_INVALID_VALUE;
  PoolRelease(it->second, keep);
  return CUDA_SUCCESS;
}
#define FAKE_ASYNC_ALLOC(fn)                                         \
  FAKE_EXPORT CUresult fn(CUdeviceptr* p, size_t size, CUstream s) { \
    LOCKED;                                                          \
    REQUIRE_INIT();                                                  \
    const int dev = CurrentPhysical();                               \
    if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;                  \
    return PoolAlloc(p, size, DefaultPool(dev), s);                  \
  }
FAKE_ASYNC_ALLOC(cuMemAllocAsync)
FAKE_ASYNC_ALLOC(cuMemAllocAsync_ptsz)
#define FAKE_POOL_ALLOC(fn)                                                             \
  FAKE_EXPORT CUresult fn(CUdeviceptr* p, size_t size, CUmemoryPool pool, CUstream s) { \
    LOCKED;                                                                             \
    return PoolAlloc(p, size, pool, s);                                                 \
  }
FAKE_POOL_ALLOC(cuMemAllocFromPoolAsync)
FAKE_POOL_ALLOC(cuMemAllocFromPoolAsync_ptsz)
#define FAKE_ASYNC_FREE(fn)                                            \
  FAKE_EXPORT CUresult fn(CUdeviceptr p, CUstream) {                   \
    LOCKED;                                                            \
    auto it = M().pooled.find(p);                                      \
    if (it == M().pooled.end()) {                                      \
      /* a plain allocation freed asynchronously */                    \
      auto a = M().allocations.find(p);                                \
      if (a == M().allocations.end()) return CUDA_ERROR_INVALID_VALUE; \
      UnchargePhysical(a->second.physical, a->second.size);            \
      M().allocations.erase(a);                                        \
      return CUDA_SUCCESS;                                             \
    }                                                                  \
    Pool& pl = M().pools[it->second];                                  \
    pl.used -= M().allocations[p].size;                                \
    M().allocations.erase(p);                                          \
    M().pooled.erase(it);                                              \
    PoolRelease(pl, pl.threshold);                                     \
    return CUDA_SUCCESS;                                               \
  }
FAKE_ASYNC_FREE(cuMemFreeAsync)
FAKE_ASYNC_FREE(cuMemFreeAsync_ptsz)

// Graph memory: a graph's memory nodes reserve on the device's graph pool
// at launch; trimming gives back what no launched graph holds.
FAKE_EXPORT CUresult cuGraphCreate(CUgraph* g, unsigned int) {
  LOCKED;
  *g = NewHandle<CUgraph>();
  M().graphs[*g].physical = std::max(0, CurrentPhysical());
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphDestroy(CUgraph g) {
  LOCKED;
  M().graphs.erase(g);
  return CUDA_SUCCESS;
}
FAKE_EXPORT
CUresult cuGraphAddMemAllocNode(CUgraphNode* node, CUgraph g, const CUgraphNode*, size_t,
                                CUDA_MEM_ALLOC_NODE_PARAMS* params) {
  LOCKED;
  M().graphs[g].mem_bytes += params->bytesize;
  params->dptr = M().next_address;
  M().next_address += (params->bytesize + 0xFFFF) & ~0xFFFFull;
  *node = NewHandle<CUgraphNode>();
  M().graphs[g].nodes.push_back(*node);
  M().mem_nodes[*node] = *params;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphMemAllocNodeGetParams(CUgraphNode node, CUDA_MEM_ALLOC_NODE_PARAMS* params) {
  LOCKED;
  auto it = M().mem_nodes.find(node);
  if (it == M().mem_nodes.end()) return CUDA_ERROR_INVALID_VALUE;
  *params = it->second;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphGetNodes(CUgraph g, CUgraphNode* nodes, size_t* count) {
  LOCKED;
  auto it = M().graphs.find(g);
  if (it == M().graphs.end() || count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto& all = it->second.nodes;
  if (nodes != nullptr)
    for (std::size_t i = 0; i < std::min(*count, all.size()); ++i) nodes[i] = all[i];
  *count = all.size();
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphNodeGetType(CUgraphNode, CUgraphNodeType* type) {
  *type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* e, CUgraph g, unsigned long long) {
  LOCKED;
  *e = NewHandle<CUgraphExec>();
  M().execs[*e] = M().graphs[g];
  return CUDA_SUCCESS;
}
// A graph runs on its stream for FAKE_CUDA_GRAPH_US (0: ends at once).
// Its memory comes from the device's graph pool; graphs running at once on
// other streams hold theirs, so the pool holds the sum (one stream's graphs
// run one after another and reuse it).
CUresult GraphLaunch(CUgraphExec e, CUstream stream, bool runs = true) {
  LOCKED;
  auto it = M().execs.find(e);
  if (it == M().execs.end()) return CUDA_ERROR_INVALID_VALUE;
  const int p = it->second.physical;
  Model& m = M();
  const std::uint64_t micros = fake_gpu::EnvU64("FAKE_CUDA_GRAPH_US", 0);
  const std::uint64_t now = NowNs();
  Stream* st = nullptr;
  if (auto s = m.streams.find(stream); s != m.streams.end()) st = &s->second;
  const std::uint64_t start = std::max(now, st ? st->end_ns : 0);
  std::erase_if(m.graph_runs, [&](const Model::GraphRun& r) { return r.end_ns <= now; });
  std::uint64_t need = it->second.mem_bytes;
  for (const Model::GraphRun& r : m.graph_runs)
    if (r.physical == p && r.stream != stream && r.end_ns > start) need += r.bytes;
  if (need > m.graph_reserved[p]) {
    if (ChargePhysical(p, need - m.graph_reserved[p]) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
    m.graph_reserved[p] = need;
  }
  m.graph_in_use[p] = std::max(m.graph_in_use[p], need);
  if (runs && micros > 0 && it->second.mem_bytes > 0) {
    m.graph_runs.push_back({p, stream, it->second.mem_bytes, start + micros * 1000});
    if (st) st->end_ns = start + micros * 1000;
  }
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
  return GraphLaunch(e, s);
}
FAKE_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s) {
  return GraphLaunch(e, s);
}
FAKE_EXPORT CUresult cuGraphUpload(CUgraphExec e, CUstream s) {
  return GraphLaunch(e, s, /*runs=*/false);  // reserves, runs nothing
}
FAKE_EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec e, CUstream s) {
  return GraphLaunch(e, s, /*runs=*/false);
}
FAKE_EXPORT CUresult cuGraphExecDestroy(CUgraphExec e) {
  LOCKED;
  M().execs.erase(e);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice d) {
  LOCKED;
  const int p = Physical(d);
  if (p < 0) return CUDA_ERROR_INVALID_DEVICE;
  // The fake's graphs free their memory nodes at the end of each launch.
  M().graph_in_use[p] = 0;
  UnchargePhysical(p, M().graph_reserved[p]);
  M().graph_reserved[p] = 0;
  return CUDA_SUCCESS;
}
std::atomic<long> graph_mem_queries{0};
// For tests: how often the process read its devices' graph memory.
FAKE_EXPORT long fake_cuda_graph_mem_queries() {
  return graph_mem_queries.load();
}
FAKE_EXPORT
CUresult cuDeviceGetGraphMemAttribute(CUdevice d, CUgraphMem_attribute attr, void* value) {
  ++graph_mem_queries;
  LOCKED;
  const int p = Physical(d);
  if (p < 0) return CUDA_ERROR_INVALID_DEVICE;
  auto* v = static_cast<cuuint64_t*>(value);
  if (attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT) {
    *v = M().graph_reserved[p];
  } else if (attr == CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) {
    *v = M().graph_in_use[p];
  } else {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}
#endif  // !FAKE_CUDA_OLD

FAKE_EXPORT CUresult cuGetErrorString(CUresult e, const char** s) {
  *s = e == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory" : "fake error";
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGetErrorName(CUresult e, const char** s) {
  *s = e == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_FAKE";
  return CUDA_SUCCESS;
}

// --- cuGetProcAddress ----------------------------------------------------------

namespace {

struct Entry {
  const char* api;
  int version;
  bool per_thread;
  void* fn;
};

#define E(api, version, pt, fn) \
  { api, version, pt, reinterpret_cast<void*>(&fn) }
const Entry kEntries[] = {
    E("cuInit", 2000, false, cuInit),
    E("cuDriverGetVersion", 2020, false, cuDriverGetVersion),
    E("cuDeviceGetCount", 2000, false, cuDeviceGetCount),
    E("cuDeviceGet", 2000, false, cuDeviceGet),
    E("cuDeviceGetName", 2000, false, cuDeviceGetName),
    E("cuDeviceGetUuid", 9020, false, cuDeviceGetUuid),
    E("cuDeviceGetUuid", 11040, false, cuDeviceGetUuid_v2),
    E("cuDeviceGetAttribute", 2000, false, cuDeviceGetAttribute),
    E("cuDeviceTotalMem", 2000, false, cuDeviceTotalMem),
    E("cuDeviceTotalMem", 3020, false, cuDeviceTotalMem_v2),
    E("cuCtxCreate", 2000, false, cuCtxCreate),
    E("cuCtxCreate", 3020, false, cuCtxCreate_v2),
    E("cuCtxCreate", 11040, false, cuCtxCreate_v3),
    E("cuCtxCreate", 12050, false, cuCtxCreate_v4),
    E("cuCtxDestroy", 2000, false, cuCtxDestroy),
    E("cuCtxDestroy", 4000, false, cuCtxDestroy_v2),
    E("cuDevicePrimaryCtxRetain", 7000, false, cuDevicePrimaryCtxRetain),
    E("cuDevicePrimaryCtxRelease", 7000, false, cuDevicePrimaryCtxRelease),
    E("cuDevicePrimaryCtxRelease", 11000, false, cuDevicePrimaryCtxRelease_v2),
    E("cuDevicePrimaryCtxReset", 7000, false, cuDevicePrimaryCtxReset),
    E("cuDevicePrimaryCtxReset", 11000, false, cuDevicePrimaryCtxReset_v2),
    E("cuCtxSetCurrent", 4000, false, cuCtxSetCurrent),
    E("cuCtxGetCurrent", 4000, false, cuCtxGetCurrent),
    E("cuCtxPushCurrent", 4000, false, cuCtxPushCurrent_v2),
    E("cuCtxPopCurrent", 4000, false, cuCtxPopCurrent_v2),
    E("cuCtxGetDevice", 2000, false, cuCtxGetDevice),
    E("cuCtxSynchronize", 2000, false, cuCtxSynchronize),
    E("cuCtxSetLimit", 3010, false, cuCtxSetLimit),
    E("cuMemGetInfo", 2000, false, cuMemGetInfo),
    E("cuMemGetInfo", 3020, false, cuMemGetInfo_v2),
    E("cuMemAlloc", 2000, false, cuMemAlloc),
    E("cuMemAlloc", 3020, false, cuMemAlloc_v2),
    E("cuMemAllocPitch", 3020, false, cuMemAllocPitch_v2),
    E("cuMemAllocManaged", 6000, false, cuMemAllocManaged),
    E("cuMemFree", 2000, false, cuMemFree),
    E("cuMemFree", 3020, false, cuMemFree_v2),
    E("cuMemAllocHost", 3020, false, cuMemAllocHost_v2),
    E("cuMemFreeHost", 2000, false, cuMemFreeHost),
    E("cuMemGetAddressRange", 3020, false, cuMemGetAddressRange_v2),
    E("cuArrayCreate", 3020, false, cuArrayCreate_v2),
    E("cuArray3DCreate", 3020, false, cuArray3DCreate_v2),
    E("cuArrayDestroy", 2000, false, cuArrayDestroy),
    E("cuArrayGetMemoryRequirements", 11060, false, cuArrayGetMemoryRequirements),
    E("cuMipmappedArrayCreate", 5000, false, cuMipmappedArrayCreate),
    E("cuMipmappedArrayGetMemoryRequirements", 11060, false, cuMipmappedArrayGetMemoryRequirements),
    E("cuMipmappedArrayDestroy", 5000, false, cuMipmappedArrayDestroy),
    E("cuModuleLoad", 2000, false, cuModuleLoad),
    E("cuModuleLoadData", 2000, false, cuModuleLoadData),
    E("cuModuleLoadDataEx", 2010, false, cuModuleLoadDataEx),
    E("cuModuleLoadFatBinary", 2000, false, cuModuleLoadFatBinary),
    E("cuModuleUnload", 2000, false, cuModuleUnload),
    E("cuModuleGetFunction", 2000, false, cuModuleGetFunction),
    E("cuLibraryLoadData", 12000, false, cuLibraryLoadData),
    E("cuLibraryLoadFromFile", 12000, false, cuLibraryLoadFromFile),
    E("cuLibraryUnload", 12000, false, cuLibraryUnload),
    E("cuLaunchKernel", 4000, false, cuLaunchKernel),
    E("cuLaunchKernel", 7000, true, cuLaunchKernel_ptsz),
    E("cuLaunchKernelEx", 11060, false, cuLaunchKernelEx),
    E("cuLaunchKernelEx", 11060, true, cuLaunchKernelEx_ptsz),
    E("cuLaunchCooperativeKernel", 9000, false, cuLaunchCooperativeKernel),
    E("cuLaunchCooperativeKernel", 9000, true, cuLaunchCooperativeKernel_ptsz),
    E("cuStreamCreate", 2000, false, cuStreamCreate),
    E("cuStreamDestroy", 4000, false, cuStreamDestroy_v2),
    E("cuStreamSynchronize", 2000, false, cuStreamSynchronize),
    E("cuStreamSynchronize", 7000, true, cuStreamSynchronize_ptsz),
    E("cuEventCreate", 2000, false, cuEventCreate),
    E("cuEventDestroy", 4000, false, cuEventDestroy_v2),
    E("cuEventRecord", 2000, false, cuEventRecord),
    E("cuEventRecord", 7000, true, cuEventRecord_ptsz),
    E("cuEventQuery", 2000, false, cuEventQuery),
    E("cuEventSynchronize", 2000, false, cuEventSynchronize),
    E("cuEventElapsedTime", 2000, false, cuEventElapsedTime),
    E("cuEventElapsedTime", 12080, false, cuEventElapsedTime_v2),
    E("cuGetErrorString", 6000, false, cuGetErrorString),
    E("cuGetErrorName", 6000, false, cuGetErrorName),
#if !defined(FAKE_CUDA_OLD)
    E("cuMemGetAllocationGranularity", 10020, false, cuMemGetAllocationGranularity),
    E("cuMemCreate", 10020, false, cuMemCreate),
    E("cuMemRelease", 10020, false, cuMemRelease),
    E("cuMemAddressReserve", 10020, false, cuMemAddressReserve),
    E("cuMemAddressFree", 10020, false, cuMemAddressFree),
    E("cuMemMap", 10020, false, cuMemMap),
    E("cuMemUnmap", 10020, false, cuMemUnmap),
    E("cuMemSetAccess", 10020, false, cuMemSetAccess),
    E("cuMemRetainAllocationHandle", 11000, false, cuMemRetainAllocationHandle),
    E("cuMemGetAllocationPropertiesFromHandle", 10020, false, cuMemGetAllocationPropertiesFromHandle),
    E("cuMemExportToShareableHandle", 10020, false, cuMemExportToShareableHandle),
    E("cuMemImportFromShareableHandle", 10020, false, cuMemImportFromShareableHandle),
    E("cuMemMapArrayAsync", 11010, false, cuMemMapArrayAsync),
    E("cuMemMapArrayAsync", 11010, true, cuMemMapArrayAsync_ptsz),
    E("cuMemPoolCreate", 11020, false, cuMemPoolCreate),
    E("cuMemPoolDestroy", 11020, false, cuMemPoolDestroy),
    E("cuDeviceGetDefaultMemPool", 11020, false, cuDeviceGetDefaultMemPool),
    E("cuDeviceGetMemPool", 11020, false, cuDeviceGetMemPool),
    E("cuMemPoolGetAttribute", 11020, false, cuMemPoolGetAttribute),
    E("cuMemPoolSetAttribute", 11020, false, cuMemPoolSetAttribute),
    E("cuMemPoolTrimTo", 11020, false, cuMemPoolTrimTo),
    E("cuMemAllocAsync", 11020, false, cuMemAllocAsync),
    E("cuMemAllocAsync", 11020, true, cuMemAllocAsync_ptsz),
    E("cuMemAllocFromPoolAsync", 11020, false, cuMemAllocFromPoolAsync),
    E("cuMemAllocFromPoolAsync", 11020, true, cuMemAllocFromPoolAsync_ptsz),
    E("cuMemFreeAsync", 11020, false, cuMemFreeAsync),
    E("cuMemFreeAsync", 11020, true, cuMemFreeAsync_ptsz),
    E("cuGraphCreate", 10000, false, cuGraphCreate),
    E("cuGraphDestroy", 10000, false, cuGraphDestroy),
    E("cuGraphAddMemAllocNode", 11040, false, cuGraphAddMemAllocNode),
    E("cuGraphGetNodes", 10000, false, cuGraphGetNodes),
    E("cuGraphNodeGetType", 10000, false, cuGraphNodeGetType),
    E("cuGraphMemAllocNodeGetParams", 11040, false, cuGraphMemAllocNodeGetParams),
    E("cuGraphInstantiateWithFlags", 11040, false, cuGraphInstantiateWithFlags),
    E("cuGraphLaunch", 10000, false, cuGraphLaunch),
    E("cuGraphLaunch", 10000, true, cuGraphLaunch_ptsz),
    E("cuGraphUpload", 11010, false, cuGraphUpload),
    E("cuGraphUpload", 11010, true, cuGraphUpload_ptsz),
    E("cuGraphExecDestroy", 10000, false, cuGraphExecDestroy),
    E("cuDeviceGraphMemTrim", 11040, false, cuDeviceGraphMemTrim),
    E("cuDeviceGetGraphMemAttribute", 11040, false, cuDeviceGetGraphMemAttribute),
#endif
};
#undef E

}  // namespace

CUresult FindProc(const char* symbol, void** pfn, int version, cuuint64_t flags,
                  CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  const Entry* best = nullptr;
  bool known = false;
  for (const auto& e : kEntries) {
    if (std::strcmp(e.api, symbol) != 0) continue;
    known = true;
    if (e.version > version) continue;
    // The per-thread variant where asked for and there is one; else the plain.
    if (e.per_thread && !per_thread) continue;
    if (best == nullptr || e.version > best->version || (e.version == best->version && e.per_thread)) best = &e;
  }
  // FAKE_CUDA_NEWER=name: a driver that knows a newer variant of `name`
  // (CUDA 13.5) than any toolkit the interposer was built with.
  static CUresult (*newer)(CUdeviceptr*, size_t) = [](CUdeviceptr* p, size_t n) { return cuMemAlloc_v2(p, n); };
  if (const char* name = std::getenv("FAKE_CUDA_NEWER"); name && std::strcmp(name, symbol) == 0 && version >= 13050) {
    static Entry future = {"", 13050, false, reinterpret_cast<void*>(newer)};
    best = &future;
  }
  if (std::strcmp(symbol, "cuGetProcAddress") == 0) {
    known = true;
    extern CUresult cuGetProcAddress_v2(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
    static Entry self = {"cuGetProcAddress", 12000, false, reinterpret_cast<void*>(&cuGetProcAddress_v2)};
    if (version >= 11030) best = &self;
  }
  if (status)
    *status = best ? CU_GET_PROC_ADDRESS_SUCCESS
                   : (known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  if (best == nullptr) return CUDA_ERROR_NOT_FOUND;
  *pfn = best->fn;
  // FAKE_CUDA_UNBOUND=1: a driver whose lookups bind by name in the global
  // scope (no -Bsymbolic), so they answer with whatever is preloaded: the
  // interposer's own hooks.
  if (const char* unbound = std::getenv("FAKE_CUDA_UNBOUND"); unbound && *unbound == '1') {
    Dl_info info{};
    if (::dladdr(best->fn, &info) && info.dli_sname != nullptr)
      if (void* global = ::dlsym(RTLD_DEFAULT, info.dli_sname)) *pfn = global;
  }
  return CUDA_SUCCESS;
}

FAKE_EXPORT
CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* status) {
  return FindProc(symbol, pfn, version, flags, status);
}
FAKE_EXPORT
CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  return FindProc(symbol, pfn, version, flags, nullptr);
}

// --- test controls ---------------------------------------------------------------

// Bytes this process holds on physical device `d`, as the fake device sees them.
extern "C" __attribute__((visibility("default"))) unsigned long long fakeCudaProcessUsed(int d) {
  Lock lock;
  return fake_gpu::Self()->used[d];
}
// Bytes every live process holds on physical device `d`.
extern "C" __attribute__((visibility("default"))) unsigned long long fakeCudaDeviceUsed(int d) {
  Lock lock;
  return fake_gpu::UsedOn(d);
}
