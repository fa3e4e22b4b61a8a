// The interposer's state in one process: its configuration, its slot in
// the ledger, what it knows of each visible device, and the accounting of
// every allocation it has seen (by API, so that a free, a context's end or
// a pool's trim gives back exactly what was charged).
//
// Initialised on the first hooked call. When the configuration is bad or
// the ledger cannot be used, every hooked call fails (the reason printed
// once on stderr): a process is never silently unlimited.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "share/interposer/cuda_api.h"
#include "share/ledger.h"
#include "share/share_config.h"

namespace stoker::share {

// A device as the interposer knows it: its CUDA ordinal in this process,
// its entry in the memory ledger, and in the compute schedule (the same
// file, or the node's turns file).
struct Dev {
  int ordinal = -1;
  int ledger = -1;
  int turns = -1;
  std::uint32_t compute_share = 0;  // percent on this device; 0: launches not held to turns
};

// Driver functions the interposer calls but does not hook (looked up once).
struct DriverCalls {
  PFN_cuCtxGetCurrent_v4000 ctx_get_current = nullptr;
  PFN_cuCtxGetDevice_v2000 ctx_get_device = nullptr;
  PFN_cuCtxPushCurrent_v4000 ctx_push = nullptr;
  PFN_cuCtxPopCurrent_v4000 ctx_pop = nullptr;
  PFN_cuCtxSynchronize_v2000 ctx_synchronize = nullptr;
  PFN_cuEventCreate_v2000 event_create = nullptr;
  PFN_cuEventRecord_v2000 event_record = nullptr;
  PFN_cuEventQuery_v2000 event_query = nullptr;
  PFN_cuStreamIsCapturing_v10000 stream_is_capturing = nullptr;
  PFN_cuThreadExchangeStreamCaptureMode_v10010 exchange_capture_mode = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetCount_v2000 device_get_count = nullptr;
  PFN_cuDeviceGetUuid_v9020 device_get_uuid = nullptr;
  PFN_cuDeviceTotalMem_v3020 device_total_mem = nullptr;
  PFN_cuMemGetInfo_v3020 mem_get_info = nullptr;
  PFN_cuInit_v2000 init = nullptr;
  PFN_cuDeviceGetMemPool_v11020 device_get_mem_pool = nullptr;
  PFN_cuDeviceGetDefaultMemPool_v11020 device_get_default_mem_pool = nullptr;
  PFN_cuMemPoolGetAttribute_v11020 pool_get_attribute = nullptr;
  PFN_cuArrayGetMemoryRequirements_v11060 array_requirements = nullptr;
  PFN_cuMipmappedArrayGetMemoryRequirements_v11060 mipmapped_requirements = nullptr;
  PFN_cuDeviceGetGraphMemAttribute_v11040 graph_mem_attribute = nullptr;
  PFN_cuArrayDestroy_v2000 array_destroy = nullptr;
  PFN_cuMipmappedArrayDestroy_v5000 mipmapped_destroy = nullptr;
  PFN_cuArray3DCreate_v3020 array3d_create = nullptr;
  PFN_cuGraphGetNodes_v10000 graph_get_nodes = nullptr;
  PFN_cuGraphNodeGetType_v10000 graph_node_type = nullptr;
  PFN_cuGraphChildGraphNodeGetGraph_v10000 graph_child = nullptr;
  PFN_cuGraphMemAllocNodeGetParams_v11040 graph_mem_node_params = nullptr;
  PFN_cuMipmappedArrayCreate_v5000 mipmapped_create = nullptr;
};

class Interposer {
 public:
  // The process's interposer, initialised on first use.
  static Interposer& Get();

  [[nodiscard]] bool ok() const { return ok_; }
  [[nodiscard]] bool scheduled() const { return scheduled_; }
  // What a hooked call answers when the interposer is not usable (and the
  // reason, printed once).
  CUresult Refuse();
  // After the driver initialised: a per-device limit for an ordinal this
  // process does not see is a mistake (a quota that guards nothing), not
  // something to ignore. False (the process refused) when there is one.
  bool CheckLimitOrdinals();
  const DriverCalls& driver() const { return calls_; }
  Ledger& ledger() { return *ledger_; }
  // The compute schedule: the memory ledger itself, the node's turns file
  // where each user has a ledger of their own, or the node agent's
  // (brokered_turns.h) where it keeps that file.
  TurnSchedule& turns() { return *turns_; }
  const ShareConfig& config() const { return config_; }

  // The device of the calling thread's current context; false when there
  // is none (the hook then lets the driver answer).
  bool CurrentDevice(Dev* dev, CUcontext* ctx = nullptr);
  // Device `ordinal`, registered in the ledger with its quota.
  bool DeviceOf(int ordinal, Dev* dev);
  // The quota and physical size of device `ordinal` (kNoQuota: none).
  std::uint64_t QuotaOf(int ordinal);
  std::uint64_t PhysicalOf(int ordinal);
  // The CUDA ordinal with this UUID, or -1.
  int OrdinalOfUuid(const std::uint8_t uuid[16]);

  // Admission: charge `bytes` on `dev` or refuse (after taking back what
  // pools, graphs and the driver's own view say was given back).
  // `in_flight`: memory the driver has just given is not tracked yet, so
  // the driver's per-process view must not be reconciled now.
  bool Admit(const Dev& dev, std::uint64_t bytes, bool in_flight = false);

  // --- accounting (what each API took; see the hooks) ---
  struct Block {  // a plain allocation, an array, a module
    CUcontext ctx = nullptr;
    Dev dev;
    std::uint64_t bytes = 0;
  };
  struct Handle {  // a VMM allocation on a device
    Dev dev;
    std::uint64_t bytes = 0;
    int refs = 0;
  };
  struct Pool {
    Dev dev;
    bool device = true;  // false: host memory, never charged
    std::uint64_t charged = 0;
    // The smallest growth seen that covered its shortfall (the driver grows
    // pools by chunks): what the next growth is admitted in. 0: none seen.
    std::uint64_t chunk = 0;
  };
  struct Context {
    Dev dev;
    std::uint64_t measured = 0;  // the context, and what cuCtxSetLimit grew in it
  };

  std::mutex mu;  // guards everything below
  std::unordered_map<CUdeviceptr, Block> allocations;
  std::unordered_map<void*, Block> arrays;  // CUarray and CUmipmappedArray
  // Handles mapped into the tiles of sparse or deferred-mapping arrays
  // (cuMemMapArrayAsync): each holds a reference to its handle. Keyed by
  // the array, then (mip tail?, layer, level or offset, x, y, z).
  std::map<void*, std::map<std::array<std::uint64_t, 6>, CUmemGenericAllocationHandle>> array_maps;
  std::unordered_map<void*, Block> modules;  // CUmodule and CUlibrary
  std::unordered_map<CUmemGenericAllocationHandle, Handle> handles;
  std::map<CUdeviceptr, std::pair<CUmemGenericAllocationHandle, std::uint64_t>> mappings;
  std::unordered_map<CUmemoryPool, Pool> pools;
  std::unordered_map<CUdeviceptr, CUmemoryPool> pooled;
  std::unordered_map<CUcontext, Context> contexts;
  int primary_refs[kMaxOrdinals] = {};
  CUcontext primary[kMaxOrdinals] = {};
  std::uint64_t graph_charged[kMaxOrdinals] = {};
  // What a fresh pool on each device reserves for its first allocation
  // (pool_probe.h), measured once: 0 until then, or where it failed.
  std::uint64_t pool_chunk[kMaxOrdinals] = {};
  bool pool_chunk_measured[kMaxOrdinals] = {};
  std::mutex pool_probe_mu;  // one probe at a time (held without `mu`)
  // Graph executables with memory nodes (their own or a child graph's), and
  // what those nodes allocate together: a launch is admitted for what the
  // device's graph reservation would have to grow by, and the reservation
  // is read after it. Others hold none, and their launches read nothing.
  // Its own lock: read on every graph launch.
  std::mutex graph_mu;
  std::unordered_map<CUgraphExec, std::uint64_t> graphs_with_memory;
  // Launches of those executables that may still be running: an event is
  // recorded after each on its stream. Graphs running at once on different
  // streams hold their memory together, so a launch is admitted for its
  // own memory plus theirs. graph_mu.
  struct GraphRun {
    int ordinal = -1;
    const void* stream = nullptr;  // the stream's identity (a per-thread default stream: its thread's)
    std::uint64_t bytes = 0;
    CUevent done = nullptr;
  };
  std::vector<GraphRun> graph_runs;
  // False when the driver cannot list a graph's nodes: every launch is
  // then followed by a read, at most every few milliseconds.
  std::atomic<bool> graph_nodes_known{true};
  // Bytes charged through the APIs above, and the rest of what the driver
  // holds for this process (contexts, modules, lazily loaded code).
  std::uint64_t tracked[kMaxOrdinals] = {};
  std::uint64_t overhead[kMaxOrdinals] = {};

  // Adds/removes tracked bytes and the ledger's charge together (mu held
  // for the tracked part by the caller).
  void Track(const Dev& dev, std::uint64_t bytes);
  void Untrack(const Dev& dev, std::uint64_t bytes);
  // Measured memory (contexts, modules): charged without admission, or
  // replacing a reservation admitted before (`reserved` bytes).
  void AddOverhead(const Dev& dev, std::uint64_t bytes, std::uint64_t reserved = 0);
  void ForgetOverhead(const Dev& dev, std::uint64_t bytes);
  // Measures what `create` adds to device `dev` (contexts, modules): the
  // driver's or NVML's device-wide view before and after.
  template <typename Create>
  // `reserved`: bytes this process reserved for it already (not yet on the
  // device, though the ledger counts them).
  CUresult Measure(const Dev& dev, std::uint64_t* measured, Create create, std::uint64_t reserved = 0);

  // The device memory in use on `ordinal` as the driver or NVML sees it
  // (device-wide), or false.
  bool DeviceUsed(int ordinal, std::uint64_t* used);
  // What NVML's per-process list says this process uses on `ordinal`
  // (`*listed` false: not in it, `*used` 0); false when NVML cannot tell.
  bool OwnUsage(int ordinal, std::uint64_t* used, bool* listed);
  // Charges what the driver holds for this process beyond the tracked
  // allocations (NVML's per-process view), where NVML can tell.
  // `force`: now; else at most every kReconcileEveryNs per device (the
  // memory queries' path: NVML's process list costs tens of microseconds).
  void Reconcile(int ordinal, bool force = true);
  static constexpr std::uint64_t kReconcileEveryNs = 100'000'000;
  // Not listed by NVML: asked again after a second (this on top).
  static constexpr std::uint64_t kNotListedBackoffNs = 900'000'000;
  // Re-reads pool reservations and graph memory on `ordinal` (all: -1).
  void RefreshPools(int ordinal);
  void RefreshGraphMemory(int ordinal);
  // What the memory allocation nodes of `graph` (and of its child graphs)
  // allocate together: nullopt when the driver cannot list its nodes, 0
  // when it has none, and 1 at least when it has some whose sizes cannot
  // be read.
  std::optional<std::uint64_t> GraphMemoryBytes(CUgraph graph, int depth = 0);
  // Before launching a graph whose nodes allocate `bytes` on `dev`: admits
  // what the device's graph reservation would grow by. False: refused.
  bool AdmitGraphLaunch(const Dev& dev, std::uint64_t bytes);
  // Everything charged to context `ctx` goes (the context is gone).
  void ForgetContext(CUcontext ctx);

 private:
  Interposer();
  void Initialise();
  void AfterForkInChild();

  bool ok_ = false;
  // Whether this process's launches go through the compute schedule (a
  // process without a share whose schedule could not be opened: no).
  bool scheduled_ = false;
  std::string error_;
  bool error_printed_ = false;
  ShareConfig config_;
  Ledger* ledger_ = nullptr;
  TurnSchedule* turns_ = nullptr;  // ledger_, or a schedule of its own
  DriverCalls calls_;
  struct DeviceEntry {
    bool known = false;
    std::uint8_t uuid[16] = {};
    std::uint64_t physical = 0, quota = kNoQuota;
    int ledger = -1, turns = -1;
    std::uint32_t compute_share = 0;
  };
  std::mutex devices_mu_;
  DeviceEntry devices_[kMaxOrdinals];
  std::uint64_t last_reconcile_ns_[kMaxOrdinals] = {};
};

std::uint64_t MonotonicNs();

template <typename Create>
CUresult Interposer::Measure(const Dev& dev, std::uint64_t* measured, Create create, std::uint64_t reserved) {
  // NVML's figure for this process first: a neighbour's allocation landing
  // meanwhile does not count (device-wide, it would be taken for ours).
  std::uint64_t own_before = 0, own_after = 0;
  bool listed_before = false, listed_after = false;
  const bool own = OwnUsage(dev.ordinal, &own_before, &listed_before);
  std::uint64_t before = 0, after = 0;
  const bool had_before = DeviceUsed(dev.ordinal, &before);
  // Without a before (no NVML, no context there yet): what the ledger
  // knows is on the device stands in for it.
  const std::uint64_t charged = had_before ? 0 : ledger_->DeviceCharged(dev.ledger);
  const std::uint64_t known = charged > reserved ? charged - reserved : 0;
  const CUresult r = create();
  *measured = 0;
  if (r != CUDA_SUCCESS) return r;
  if (own && OwnUsage(dev.ordinal, &own_after, &listed_after) && listed_after) {
    *measured = own_after > own_before ? own_after - own_before : 0;
  } else if (DeviceUsed(dev.ordinal, &after)) {
    const std::uint64_t base = had_before ? before : known;
    *measured = after > base ? after - base : 0;
  }
  return r;
}

}  // namespace stoker::share
