#include "share/interposer/interposer.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "share/brokered_turns.h"
#include "share/interposer/entry_points.h"
#include "share/interposer/real_driver.h"
#include "share/pinned_limits.h"

namespace stoker::share {
namespace {

Interposer* g_instance = nullptr;
bool g_forked = false;  // set in a forked child; the next Get() starts over there

template <typename Fn>
void Load(Fn* fn, const char* name) {
  *fn = reinterpret_cast<Fn>(DriverSymbol(name));
}

}  // namespace

std::uint64_t MonotonicNs() {
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

Interposer& Interposer::Get() {
  static Interposer* first = [] {
    auto* ip = new Interposer();
    // The tables' locks are taken across fork, so that a child never starts
    // with one held by a thread it does not have.
    pthread_atfork(
        [] {
          g_instance->mu.lock();
          g_instance->devices_mu_.lock();
        },
        [] {
          g_instance->devices_mu_.unlock();
          g_instance->mu.unlock();
        },
        [] {
          g_instance->devices_mu_.unlock();
          g_instance->mu.unlock();
          // At once, not when the child first calls CUDA (it may never):
          // its copies of the parent's descriptor and mapping would keep
          // the parent's slot alive, and a killed parent's charge with it,
          // for as long as the child lives.
          if (g_instance->ledger_ != nullptr) g_instance->ledger_->DetachAfterFork();
          if (g_instance->turns_ != nullptr && g_instance->turns_ != g_instance->ledger_)
            g_instance->turns_->DetachAfterFork();
          g_forked = true;
        });
    std::atexit([] {
      if (g_instance && g_instance->ok_) {
        g_instance->ledger_->Unregister();
        if (g_instance->turns_ != g_instance->ledger_) g_instance->turns_->Unregister();
      }
    });
    return ip;
  }();
  (void)first;
  if (__builtin_expect(g_forked, 0)) {
    // A forked child: it holds no device memory, and its copy of the
    // parent's ledger descriptor must not keep the parent's slot alive.
    g_forked = false;
    g_instance->AfterForkInChild();
  }
  return *g_instance;
}

Interposer::Interposer() {
  g_instance = this;
  Initialise();
}

void Interposer::Initialise() {
  std::string error;
  if (!EffectiveShareConfig([](const char* name) { return std::getenv(name); }, kPinnedLimitsPath, &config_, &error)) {
    error_ = error;
    return;
  }
  if (DriverHandle() == nullptr) {
    error_ = "cannot open the CUDA driver (libcuda.so.1)";
    return;
  }
  if (OwnFunction(DriverSymbol("cuInit"))) {
    error_ = "the CUDA driver library it opened is the interposer itself (STOKER_GPU_REAL_LIBCUDA?)";
    return;
  }
  Load(&calls_.ctx_get_current, "cuCtxGetCurrent");
  Load(&calls_.ctx_get_device, "cuCtxGetDevice");
  Load(&calls_.ctx_push, "cuCtxPushCurrent_v2");
  Load(&calls_.ctx_pop, "cuCtxPopCurrent_v2");
  Load(&calls_.ctx_synchronize, "cuCtxSynchronize");
  Load(&calls_.event_create, "cuEventCreate");
  Load(&calls_.event_record, "cuEventRecord");
  Load(&calls_.event_query, "cuEventQuery");
  Load(&calls_.stream_is_capturing, "cuStreamIsCapturing");
  Load(&calls_.exchange_capture_mode, "cuThreadExchangeStreamCaptureMode");
  Load(&calls_.device_get, "cuDeviceGet");
  Load(&calls_.device_get_count, "cuDeviceGetCount");
  Load(&calls_.device_get_uuid, "cuDeviceGetUuid");
  Load(&calls_.device_total_mem, "cuDeviceTotalMem_v2");
  Load(&calls_.mem_get_info, "cuMemGetInfo_v2");
  Load(&calls_.init, "cuInit");
  Load(&calls_.device_get_mem_pool, "cuDeviceGetMemPool");
  Load(&calls_.device_get_default_mem_pool, "cuDeviceGetDefaultMemPool");
  Load(&calls_.pool_get_attribute, "cuMemPoolGetAttribute");
  Load(&calls_.array_requirements, "cuArrayGetMemoryRequirements");
  Load(&calls_.mipmapped_requirements, "cuMipmappedArrayGetMemoryRequirements");
  Load(&calls_.graph_mem_attribute, "cuDeviceGetGraphMemAttribute");
  Load(&calls_.array_destroy, "cuArrayDestroy");
  Load(&calls_.mipmapped_destroy, "cuMipmappedArrayDestroy");
  Load(&calls_.array3d_create, "cuArray3DCreate_v2");
  Load(&calls_.graph_get_nodes, "cuGraphGetNodes");
  Load(&calls_.graph_node_type, "cuGraphNodeGetType");
  Load(&calls_.graph_child, "cuGraphChildGraphNodeGetGraph");
  Load(&calls_.graph_mem_node_params, "cuGraphMemAllocNodeGetParams");
  Load(&calls_.mipmapped_create, "cuMipmappedArrayCreate");
  if (!calls_.ctx_get_current || !calls_.ctx_get_device || !calls_.device_get || !calls_.device_get_uuid ||
      !calls_.device_total_mem || !calls_.mem_get_info) {
    error_ = "the CUDA driver lacks the context and device queries the interposer needs";
    return;
  }
  LedgerFile own;
  own.make_dir = own.must_own = config_.ledger_in_state_dir;
  ledger_ = Ledger::Open(config_.ledger_path, &error, own);
  if (ledger_ == nullptr || !ledger_->Register(config_.tenant, config_.compute_share, &error)) {
    error_ = error;
    return;
  }
  turns_ = ledger_;
  scheduled_ = !config_.compute_by_mps;
  // A process without a compute share is in the node's schedule too: it
  // takes turns on a card while a tenant with a share wants that card (see
  // ComputeGate). Where it cannot be, it launches freely, as before, and
  // says so once; a process with a share cannot run without it.
  const bool has_share = config_.HasComputeShare();
  auto without_schedule = [&](const std::string& why) {
    std::fprintf(stderr,
                 "stoker-share: note: %s; this process (pid %d) has no compute share and launches without taking "
                 "turns, also beside tenants with a share\n",
                 why.c_str(), static_cast<int>(::getpid()));
    turns_ = ledger_;
    scheduled_ = false;
  };
  if (config_.turns_path != config_.ledger_path && !config_.compute_by_mps) {
    const bool brokered =
        config_.turns_socket_named || (!config_.turns_socket.empty() && TurnsAreBrokered(config_.turns_path));
    if (brokered) {
      // The node agent keeps the schedule: it is asked, never written.
      BrokeredTurns::Options options;
      options.socket_path = config_.turns_socket;
      options.turns_path = config_.turns_path;
      options.tenant = config_.broker_tenant;
      options.compute_share = config_.compute_share;
      options.has_share = has_share;
      const std::string compute_pin = std::string(kPinnedLimitsPath) + ".d/compute";
      if (config_.pinned_from.find(compute_pin) != std::string::npos) options.proof_path = compute_pin;
      turns_ = BrokeredTurns::Open(options, &error);
      if (turns_ == nullptr) {
        if (!has_share) {
          without_schedule("the compute schedule: " + error);
        } else {
          error_ = "the compute schedule: " + error;
          turns_ = ledger_;
          return;
        }
      }
    } else {
      // The node's schedule, shared by every user: tenants there are named
      // with their user, so that two users' tenants never merge.
      LedgerFile shared;
      shared.mode = 0666;
      shared.make_dir = config_.turns_in_state_dir;
      Ledger* turns = Ledger::Open(config_.turns_path, &error, shared);
      if (turns == nullptr || !turns->Register(config_.turns_tenant, config_.compute_share, &error)) {
        delete turns;
        if (!has_share) {
          without_schedule("the compute schedule: " + error);
        } else {
          error_ = "the compute schedule: " + error;
          return;
        }
      } else {
        turns_ = turns;
      }
    }
  }
  ok_ = true;
}

void Interposer::AfterForkInChild() {
  std::lock_guard<std::mutex> lock(mu);
  allocations.clear();
  arrays.clear();
  array_maps.clear();
  modules.clear();
  handles.clear();
  mappings.clear();
  pools.clear();
  pooled.clear();
  contexts.clear();
  std::memset(primary_refs, 0, sizeof(primary_refs));
  std::memset(primary, 0, sizeof(primary));
  std::memset(graph_charged, 0, sizeof(graph_charged));
  {
    std::lock_guard<std::mutex> graphs_lock(graph_mu);
    graphs_with_memory.clear();
  }
  std::memset(tracked, 0, sizeof(tracked));
  std::memset(overhead, 0, sizeof(overhead));
  if (ok_) {
    std::string error;
    if (!ledger_->ReopenAfterFork(&error) || (turns_ != ledger_ && !turns_->ReopenAfterFork(&error))) {
      ok_ = false;
      error_ = error;
    }
  }
}

CUresult Interposer::Refuse() {
  static std::once_flag printed;
  std::call_once(printed, [this] {
    std::fprintf(stderr, "stoker-share: error: %s; GPU calls in this process (pid %d) fail\n",
                 error_.empty() ? "not initialised" : error_.c_str(), static_cast<int>(::getpid()));
  });
  return CUDA_ERROR_NOT_PERMITTED;
}

bool Interposer::CheckLimitOrdinals() {
  if (!ok_ || (config_.ordinal_limits.empty() && config_.ordinal_shares.empty()) || calls_.device_get_count == nullptr)
    return ok_;
  int count = 0;
  if (calls_.device_get_count(&count) != CUDA_SUCCESS) return ok_;
  auto beyond = [&](const char* what, std::uint32_t ordinal) {
    char detail[256];
    std::snprintf(detail, sizeof(detail),
                  "STOKER_GPU_%s_%u sets a %s on device %u, but this process sees %d device(s) (after "
                  "CUDA_VISIBLE_DEVICES)",
                  what, ordinal, std::strcmp(what, "MEMORY_LIMIT") == 0 ? "quota" : "compute share", ordinal, count);
    error_ = detail;
    ok_ = false;
    return false;
  };
  for (const auto& [ordinal, bytes] : config_.ordinal_limits)
    if (static_cast<int>(ordinal) >= count) return beyond("MEMORY_LIMIT", ordinal);
  for (const auto& [ordinal, share] : config_.ordinal_shares)
    if (static_cast<int>(ordinal) >= count) return beyond("COMPUTE_SHARE", ordinal);
  return true;
}

bool Interposer::DeviceOf(int ordinal, Dev* dev) {
  if (ordinal < 0 || ordinal >= static_cast<int>(kMaxOrdinals)) return false;
  std::lock_guard<std::mutex> lock(devices_mu_);
  DeviceEntry& e = devices_[ordinal];
  if (!e.known) {
    CUdevice device = 0;
    CUuuid uuid{};
    size_t physical = 0;
    if (calls_.device_get(&device, ordinal) != CUDA_SUCCESS || calls_.device_get_uuid(&uuid, device) != CUDA_SUCCESS ||
        calls_.device_total_mem(&physical, device) != CUDA_SUCCESS)
      return false;
    std::memcpy(e.uuid, uuid.bytes, 16);
    e.physical = physical;
    e.quota = config_.LimitFor(static_cast<std::uint32_t>(ordinal));
    e.ledger = ledger_->Device(e.uuid, e.physical);
    if (e.ledger < 0) return false;
    e.turns = turns_ == ledger_ ? e.ledger : turns_->Device(e.uuid, e.physical);
    if (e.turns < 0) return false;
    std::string error;
    if (e.quota != kNoQuota && !ledger_->SetQuota(e.ledger, e.quota, &error)) {
      error_ = error;
      ok_ = false;
      return false;
    }
    e.compute_share =
        config_.compute_by_mps ? 0 : config_.ShareFor(static_cast<std::uint32_t>(ordinal), FormatUuid(e.uuid));
    // Set in the schedule, and in the memory ledger too (what `stoker gpu
    // ls` shows of the tenant).
    if (e.compute_share != 0 && (!turns_->SetComputeShare(e.turns, e.compute_share, &error) ||
                                 (turns_ != ledger_ && !ledger_->SetComputeShare(e.ledger, e.compute_share, &error)))) {
      error_ = error;
      ok_ = false;
      return false;
    }
    e.known = true;
  }
  dev->ordinal = ordinal;
  dev->ledger = e.ledger;
  dev->turns = e.turns;
  dev->compute_share = e.compute_share;
  return true;
}

bool Interposer::CurrentDevice(Dev* dev, CUcontext* ctx) {
  CUcontext current = nullptr;
  if (calls_.ctx_get_current(&current) != CUDA_SUCCESS || current == nullptr) return false;
  if (ctx != nullptr) *ctx = current;
  CUdevice ordinal = 0;
  if (calls_.ctx_get_device(&ordinal) != CUDA_SUCCESS) return false;
  return DeviceOf(ordinal, dev);
}

std::uint64_t Interposer::QuotaOf(int ordinal) {
  Dev dev;
  if (!DeviceOf(ordinal, &dev)) return kNoQuota;
  std::lock_guard<std::mutex> lock(devices_mu_);
  return devices_[ordinal].quota;
}

std::uint64_t Interposer::PhysicalOf(int ordinal) {
  Dev dev;
  if (!DeviceOf(ordinal, &dev)) return 0;
  std::lock_guard<std::mutex> lock(devices_mu_);
  return devices_[ordinal].physical;
}

int Interposer::OrdinalOfUuid(const std::uint8_t uuid[16]) {
  int count = 0;
  if (calls_.device_get_count == nullptr || calls_.device_get_count(&count) != CUDA_SUCCESS) {
    // NVML first: the driver may not be initialised yet.
    if (calls_.init == nullptr || calls_.init(0) != CUDA_SUCCESS || calls_.device_get_count(&count) != CUDA_SUCCESS)
      return -1;
  }
  for (int o = 0; o < count && o < static_cast<int>(kMaxOrdinals); ++o) {
    Dev dev;
    if (!DeviceOf(o, &dev)) continue;
    std::lock_guard<std::mutex> lock(devices_mu_);
    if (std::memcmp(devices_[o].uuid, uuid, 16) == 0) return o;
  }
  return -1;
}

bool Interposer::Admit(const Dev& dev, std::uint64_t bytes, bool in_flight) {
  if (ledger_->Charge(dev.ledger, bytes, /*count_refusal=*/false)) return true;
  // Before refusing: what pools and graphs gave back since they were last
  // read, and the driver's own view of this process (not while an
  // allocation the driver made is not tracked yet: it would be counted as
  // overhead, and again when tracked).
  RefreshPools(dev.ordinal);
  RefreshGraphMemory(dev.ordinal);
  if (!in_flight) Reconcile(dev.ordinal);
  return ledger_->Charge(dev.ledger, bytes, /*count_refusal=*/true);
}

void Interposer::Track(const Dev& dev, std::uint64_t bytes) {
  tracked[dev.ordinal] += bytes;
}

void Interposer::Untrack(const Dev& dev, std::uint64_t bytes) {
  tracked[dev.ordinal] -= std::min(bytes, tracked[dev.ordinal]);
  ledger_->Uncharge(dev.ledger, bytes);
}

void Interposer::AddOverhead(const Dev& dev, std::uint64_t bytes, std::uint64_t reserved) {
  overhead[dev.ordinal] += bytes;
  if (reserved > 0) {
    ledger_->Settle(dev.ledger, reserved, bytes);
  } else {
    ledger_->ForceCharge(dev.ledger, bytes);
  }
}

void Interposer::ForgetOverhead(const Dev& dev, std::uint64_t bytes) {
  const std::uint64_t b = std::min(bytes, overhead[dev.ordinal]);
  overhead[dev.ordinal] -= b;
  ledger_->Uncharge(dev.ledger, b);
}

void Interposer::RefreshPools(int ordinal) {
  if (calls_.pool_get_attribute == nullptr) return;
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [pool, p] : pools) {
    if (!p.device || (ordinal >= 0 && p.dev.ordinal != ordinal)) continue;
    cuuint64_t reserved = 0;
    if (calls_.pool_get_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != CUDA_SUCCESS) continue;
    ledger_->Settle(p.dev.ledger, p.charged, reserved);
    tracked[p.dev.ordinal] = tracked[p.dev.ordinal] - std::min(p.charged, tracked[p.dev.ordinal]) + reserved;
    p.charged = reserved;
  }
}

void Interposer::RefreshGraphMemory(int ordinal) {
  if (calls_.graph_mem_attribute == nullptr) return;
  for (int o = 0; o < static_cast<int>(kMaxOrdinals); ++o) {
    if (ordinal >= 0 && o != ordinal) continue;
    Dev dev;
    {
      std::lock_guard<std::mutex> lock(devices_mu_);
      if (!devices_[o].known) continue;
      dev = {o, devices_[o].ledger, devices_[o].turns};
    }
    CUdevice device = 0;
    cuuint64_t reserved = 0;
    if (calls_.device_get(&device, o) != CUDA_SUCCESS ||
        calls_.graph_mem_attribute(device, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved) != CUDA_SUCCESS)
      continue;
    std::lock_guard<std::mutex> lock(mu);
    ledger_->Settle(dev.ledger, graph_charged[o], reserved);
    tracked[o] = tracked[o] - std::min(graph_charged[o], tracked[o]) + reserved;
    graph_charged[o] = reserved;
  }
}

std::optional<std::uint64_t> Interposer::GraphMemoryBytes(CUgraph graph, int depth) {
  if (calls_.graph_get_nodes == nullptr || calls_.graph_node_type == nullptr || depth > 16) return std::nullopt;
  size_t count = 0;
  if (calls_.graph_get_nodes(graph, nullptr, &count) != CUDA_SUCCESS) return std::nullopt;
  std::vector<CUgraphNode> nodes(count);
  if (count > 0 && calls_.graph_get_nodes(graph, nodes.data(), &count) != CUDA_SUCCESS) return std::nullopt;
  nodes.resize(std::min(count, nodes.size()));
  std::uint64_t bytes = 0;
  for (CUgraphNode node : nodes) {
    CUgraphNodeType type{};
    if (calls_.graph_node_type(node, &type) != CUDA_SUCCESS) return std::nullopt;
    if (type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
      CUDA_MEM_ALLOC_NODE_PARAMS params{};
      const bool sized = calls_.graph_mem_node_params != nullptr &&
                         calls_.graph_mem_node_params(node, &params) == CUDA_SUCCESS &&
                         params.poolProps.location.type == CU_MEM_LOCATION_TYPE_DEVICE;
      bytes += sized ? params.bytesize : 1;  // unknown: still a graph with memory
    } else if (type == CU_GRAPH_NODE_TYPE_GRAPH) {
      CUgraph child = nullptr;
      if (calls_.graph_child == nullptr || calls_.graph_child(node, &child) != CUDA_SUCCESS) return std::nullopt;
      const auto inner = GraphMemoryBytes(child, depth + 1);
      if (!inner) return std::nullopt;
      bytes += *inner;
    }
  }
  return bytes;
}

bool Interposer::AdmitGraphLaunch(const Dev& dev, std::uint64_t bytes) {
  std::uint64_t reserved = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    reserved = graph_charged[dev.ordinal];
  }
  // The device's graph pool serves every graph of the process there: it
  // grows when a graph needs more than it holds (a lower bound when graphs
  // run at once; the read after the launch charges what it really holds).
  if (bytes <= reserved) return true;
  const std::uint64_t grow = bytes - reserved;
  if (!Admit(dev, grow)) return false;
  std::lock_guard<std::mutex> lock(mu);
  graph_charged[dev.ordinal] += grow;
  tracked[dev.ordinal] += grow;
  return true;
}

void Interposer::ForgetContext(CUcontext ctx) {
  int ordinal = -1;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = arrays.begin(); it != arrays.end();) {
      if (it->second.ctx == ctx) {
        Untrack(it->second.dev, it->second.bytes);
        it = arrays.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = modules.begin(); it != modules.end();) {  // measured: part of the overhead
      if (it->second.ctx == ctx) {
        ForgetOverhead(it->second.dev, it->second.bytes);
        it = modules.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = allocations.begin(); it != allocations.end();) {
      if (it->second.ctx == ctx) {
        Untrack(it->second.dev, it->second.bytes);
        it = allocations.erase(it);
      } else {
        ++it;
      }
    }
    auto c = contexts.find(ctx);
    if (c != contexts.end()) {
      ordinal = c->second.dev.ordinal;
      ForgetOverhead(c->second.dev, c->second.measured);
      contexts.erase(c);
    }
  }
  if (ordinal >= 0) Reconcile(ordinal);
}

}  // namespace stoker::share
