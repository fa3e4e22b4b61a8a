// The node's GPUs from NVML, else from the CUDA driver; both loaded at run
// time (the toolkit here has no nvml.h, and a node without a GPU must still
// run `stoker`). Only the few entry points used are declared.
#include <dlfcn.h>

#include <cctype>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "share/nvml_types.h"
#include "stoker/gpu_place.h"

namespace stoker {
namespace {

class Library {
 public:
  explicit Library(const char* name) : handle_(::dlopen(name, RTLD_NOW | RTLD_LOCAL)) {
    if (handle_ == nullptr) {
      const char* e = ::dlerror();
      error_ = e ? e : "dlopen failed";
    }
  }
  ~Library() {
    if (handle_) ::dlclose(handle_);
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  [[nodiscard]] bool ok() const { return handle_ != nullptr; }
  [[nodiscard]] const std::string& error() const { return error_; }
  template <typename F>
  [[nodiscard]] F Get(const char* symbol) const {
    return reinterpret_cast<F>(::dlsym(handle_, symbol));
  }

 private:
  void* handle_;
  std::string error_;
};

// The NUMA node of a PCI device from sysfs ("0000:17:00.0"); -1 if unknown.
int NumaFromSysfs(std::string bus_id) {
  // NVML writes an 8-digit domain; sysfs has 4, lower case.
  if (bus_id.size() == 16 && bus_id.compare(0, 4, "0000") == 0) bus_id = bus_id.substr(4);
  for (char& c : bus_id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::ifstream in("/sys/bus/pci/devices/" + bus_id + "/numa_node");
  int node = -1;
  if (!(in >> node)) return -1;
  return node;
}

constexpr int kNvmlSuccess = 0, kNvmlInsufficientSize = 7, kNvmlGpuIsLost = 15;
Result<GpuInventory> FromNvml() {
  Library nvml("libnvidia-ml.so.1");
  if (!nvml.ok()) return Status::NotFound(nvml.error());
  using InitFn = int (*)();
  using CountFn = int (*)(unsigned int*);
  using HandleFn = int (*)(unsigned int, void**);
  using TextFn = int (*)(void*, char*, unsigned int);
  using MemV1Fn = int (*)(void*, nvmlMemory_t*);
  using MemV2Fn = int (*)(void*, nvmlMemory_v2_t*);
  using PciFn = int (*)(void*, nvmlPciInfo_t*);
  using NumaFn = int (*)(void*, unsigned int*);
  using ErrorFn = const char* (*)(int);
  using TopologyFn = int (*)(void*, void*, int*);
  using ProcessesFn = int (*)(void*, unsigned int*, nvmlProcessInfo_t*);
  auto init = nvml.Get<InitFn>("nvmlInit_v2");
  auto shutdown = nvml.Get<InitFn>("nvmlShutdown");
  auto count_fn = nvml.Get<CountFn>("nvmlDeviceGetCount_v2");
  auto handle_fn = nvml.Get<HandleFn>("nvmlDeviceGetHandleByIndex_v2");
  auto uuid_fn = nvml.Get<TextFn>("nvmlDeviceGetUUID");
  auto name_fn = nvml.Get<TextFn>("nvmlDeviceGetName");
  auto mem_v1 = nvml.Get<MemV1Fn>("nvmlDeviceGetMemoryInfo");
  auto mem_v2 = nvml.Get<MemV2Fn>("nvmlDeviceGetMemoryInfo_v2");
  auto pci_fn = nvml.Get<PciFn>("nvmlDeviceGetPciInfo_v3");
  auto numa_fn = nvml.Get<NumaFn>("nvmlDeviceGetNumaNodeId");
  auto error_fn = nvml.Get<ErrorFn>("nvmlErrorString");
  auto topology_fn = nvml.Get<TopologyFn>("nvmlDeviceGetTopologyCommonAncestor");
  auto processes_fn = nvml.Get<ProcessesFn>("nvmlDeviceGetComputeRunningProcesses_v3");
  std::vector<void*> handles;
  if (!init || !count_fn || !handle_fn || !uuid_fn || !(mem_v1 || mem_v2))
    return Status::NotFound("libnvidia-ml.so.1 lacks nvmlInit_v2, nvmlDeviceGetCount_v2 or the memory queries");
  auto why = [&](int r) { return error_fn ? std::string(error_fn(r)) : fmt::format("NVML error {}", r); };
  if (int r = init(); r != kNvmlSuccess) return Status::Unavailable("nvmlInit_v2: " + why(r));
  GpuInventory inventory;
  inventory.source = "NVML";
  unsigned int count = 0;
  Status status;
  if (int r = count_fn(&count); r != kNvmlSuccess) status = Status::Unavailable("nvmlDeviceGetCount_v2: " + why(r));
  for (unsigned int i = 0; status.ok() && i < count; ++i) {
    void* device = nullptr;
    GpuCard card;
    card.index = static_cast<int>(i);
    const bool have_handle = handle_fn(i, &device) == kNvmlSuccess;
    handles.push_back(have_handle ? device : nullptr);
    if (!have_handle) {
      card.uuid = fmt::format("unknown-{}", i);
      card.healthy = false;
      inventory.cards.push_back(card);
      continue;
    }
    char text[96] = {};
    const int uuid_result = uuid_fn(device, text, sizeof(text));
    card.uuid = uuid_result == kNvmlSuccess ? text : fmt::format("unknown-{}", i);
    if (name_fn && name_fn(device, text, sizeof(text)) == kNvmlSuccess) card.name = text;
    int mem_result = -1;
    if (mem_v2) {
      nvmlMemory_v2_t m{};
      m.version = static_cast<unsigned int>(sizeof(nvmlMemory_v2_t)) | (2u << 24);
      mem_result = mem_v2(device, &m);
      if (mem_result == kNvmlSuccess) {
        card.total_bytes = m.total;
        card.used_bytes = m.used;  // the driver's reserve is apart
      }
    }
    if (mem_result != kNvmlSuccess && mem_result != kNvmlGpuIsLost && mem_v1) {
      nvmlMemory_t m{};
      mem_result = mem_v1(device, &m);
      if (mem_result == kNvmlSuccess) {
        card.total_bytes = m.total;
        card.used_bytes = m.used;
      }
    }
    card.used_known = mem_result == kNvmlSuccess;
    card.healthy = uuid_result == kNvmlSuccess && mem_result == kNvmlSuccess;
    if (pci_fn) {
      nvmlPciInfo_t pci{};
      if (pci_fn(device, &pci) == kNvmlSuccess)
        card.pci_bus_id.assign(pci.busId, strnlen(pci.busId, sizeof(pci.busId)));
    }
    unsigned int node = 0;
    if (numa_fn && numa_fn(device, &node) == kNvmlSuccess) {
      card.numa_node = static_cast<int>(node);
    } else if (!card.pci_bus_id.empty()) {
      card.numa_node = NumaFromSysfs(card.pci_bus_id);
    }
    if (processes_fn) {
      std::vector<nvmlProcessInfo_t> infos(64);
      unsigned int n = static_cast<unsigned int>(infos.size());
      int r = processes_fn(device, &n, infos.data());
      if (r == kNvmlInsufficientSize) {
        infos.resize(n + 16);
        n = static_cast<unsigned int>(infos.size());
        r = processes_fn(device, &n, infos.data());
      }
      if (r == kNvmlSuccess) {
        card.processes_known = true;
        for (unsigned int k = 0; k < n && k < infos.size(); ++k)
          card.processes.push_back({static_cast<int>(infos[k].pid), infos[k].usedGpuMemory});
      }
    }
    inventory.cards.push_back(std::move(card));
  }
  // PCIe distances between cards, for sets of several cards.
  if (topology_fn && status.ok()) {
    const std::size_t n = handles.size();
    for (std::size_t a = 0; a < n; ++a) {
      std::vector<int> levels(n, 0);
      bool known = handles[a] != nullptr;
      for (std::size_t b = 0; known && b < n; ++b) {
        int level = 0;
        if (a != b && (handles[b] == nullptr || topology_fn(handles[a], handles[b], &level) != kNvmlSuccess))
          known = false;
        levels[b] = a == b ? 0 : level;
      }
      if (known) inventory.cards[a].link_levels = std::move(levels);
    }
  }
  if (shutdown) shutdown();
  if (!status.ok()) return status;
  return inventory;
}

Result<GpuInventory> FromDriver() {
  Library cuda("libcuda.so.1");
  if (!cuda.ok()) return Status::NotFound(cuda.error());
  using InitFn = int (*)(unsigned int);
  using CountFn = int (*)(int*);
  using GetFn = int (*)(int*, int);
  using UuidFn = int (*)(unsigned char*, int);
  using NameFn = int (*)(char*, int, int);
  using TotalFn = int (*)(std::size_t*, int);
  auto init = cuda.Get<InitFn>("cuInit");
  auto count_fn = cuda.Get<CountFn>("cuDeviceGetCount");
  auto get_fn = cuda.Get<GetFn>("cuDeviceGet");
  auto uuid_fn = cuda.Get<UuidFn>("cuDeviceGetUuid");
  auto name_fn = cuda.Get<NameFn>("cuDeviceGetName");
  auto total_fn = cuda.Get<TotalFn>("cuDeviceTotalMem_v2");
  auto bus_fn = cuda.Get<NameFn>("cuDeviceGetPCIBusId");
  if (!init || !count_fn || !get_fn || !uuid_fn || !total_fn)
    return Status::NotFound("libcuda.so.1 lacks cuInit, cuDeviceGetCount, cuDeviceGetUuid or cuDeviceTotalMem_v2");
  if (int r = init(0); r != 0) return Status::Unavailable(fmt::format("cuInit failed with CUDA error {}", r));
  int count = 0;
  if (int r = count_fn(&count); r != 0) return Status::Unavailable(fmt::format("cuDeviceGetCount: CUDA error {}", r));
  GpuInventory inventory;
  inventory.source = "CUDA driver";
  for (int i = 0; i < count; ++i) {
    GpuCard card;
    card.index = i;
    int device = 0;
    unsigned char u[16] = {};
    std::size_t total = 0;
    if (get_fn(&device, i) != 0 || uuid_fn(u, device) != 0 || total_fn(&total, device) != 0) {
      card.uuid = fmt::format("unknown-{}", i);
      card.healthy = false;
      inventory.cards.push_back(card);
      continue;
    }
    card.uuid = fmt::format(
        "GPU-{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
        u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    card.total_bytes = total;
    char text[96] = {};
    if (name_fn && name_fn(text, sizeof(text), device) == 0) card.name = text;
    if (bus_fn && bus_fn(text, sizeof(text), device) == 0) {
      card.pci_bus_id = text;
      card.numa_node = NumaFromSysfs(card.pci_bus_id);
    }
    inventory.cards.push_back(std::move(card));
  }
  return inventory;
}

}  // namespace

Result<GpuInventory> ReadGpuInventory() {
  auto nvml = FromNvml();
  if (nvml.ok()) return nvml;
  auto driver = FromDriver();
  if (driver.ok()) return driver;
  return Status::NotFound(fmt::format("no GPU found: NVML said: {}; the CUDA driver said: {}", nvml.error().message(),
                                      driver.error().message()));
}

}  // namespace stoker
