// The share probe: a program that uses the CUDA driver (the fake one in
// CI, the real one on a GPU machine) the way applications do, run under
// the interposer by the tests (interposer_test.cc, scripts/gpu-check).
//
//   share_probe MODE [--path direct|dlsym|proc] [options]
//
// Modes: property, resolve, race, churn, killer, report, fork, orphan, limit, visible,
// bench, compute, collective, capture, alloc. Each prints one line of results (JSON where the
// tests read figures) and exits 1 with "probe: FAIL: ..." on a violation.
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "probe_util.h"
#include "share/nvml_types.h"

extern char** environ;

namespace probe {
namespace {

std::map<std::string, std::string> g_args;

std::uint64_t Arg(const char* name, std::uint64_t fallback) {
  auto it = g_args.find(name);
  return it == g_args.end() ? fallback : std::strtoull(it->second.c_str(), nullptr, 10);
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

CUcontext NewContext(const Driver& d, int ordinal) {
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  Check(d.DeviceGet(&dev, ordinal), "cuDeviceGet");
  Check(d.CtxCreate(&ctx, 0, dev), "cuCtxCreate");
  return ctx;
}

// --- race: 8 processes allocate at once, round after round ---------------

struct RaceShared {
  pthread_barrier_t barrier;
  std::atomic<int> successes;
  std::atomic<int> over_quota_rounds;
  std::atomic<std::uint64_t> max_device_used;
};

int Race(const Driver& d) {
  const int procs = static_cast<int>(Arg("procs", 8));
  const std::uint64_t rounds = Arg("rounds", 1000), size = Arg("size", 300ull << 20);
  const std::uint64_t quota = Arg("quota", 1000ull << 20);
  auto* shared = static_cast<RaceShared*>(
      mmap(nullptr, sizeof(RaceShared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  pthread_barrierattr_t attr;
  pthread_barrierattr_init(&attr);
  pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_barrier_init(&shared->barrier, &attr, static_cast<unsigned>(procs));
  std::vector<pid_t> children;
  for (int id = 0; id < procs; ++id) {
    const pid_t pid = fork();
    if (pid == 0) {  // each child starts CUDA itself
      Check(d.Init(0), "cuInit");
      (void)NewContext(d, 0);
      const int physical = PhysicalOf(d, 0);
      for (std::uint64_t r = 0; r < rounds; ++r) {
        pthread_barrier_wait(&shared->barrier);
        CUdeviceptr p = 0;
        const CUresult result = d.MemAlloc(&p, size);
        if (result == CUDA_SUCCESS)
          shared->successes.fetch_add(1);
        else if (result != CUDA_ERROR_OUT_OF_MEMORY)
          Fail("cuMemAlloc in the race: " + std::to_string(result));
        pthread_barrier_wait(&shared->barrier);
        if (id == 0) {
          const std::uint64_t used = FakeDeviceUsed(physical);
          std::uint64_t seen = shared->max_device_used.load();
          while (used > seen && !shared->max_device_used.compare_exchange_weak(seen, used)) {
          }
          if (static_cast<std::uint64_t>(shared->successes.load()) * size > quota || used > quota)
            shared->over_quota_rounds.fetch_add(1);
          shared->successes.store(0);
        }
        pthread_barrier_wait(&shared->barrier);
        if (result == CUDA_SUCCESS) Check(d.MemFree(p), "cuMemFree");
      }
      _exit(0);
    }
    children.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  std::printf(
      "{\"rounds\": %llu, \"processes\": %d, \"over_quota_rounds\": %d, \"max_device_used\": %llu, "
      "\"quota\": %llu, \"failed_processes\": %d}\n",
      static_cast<unsigned long long>(rounds), procs, shared->over_quota_rounds.load(),
      static_cast<unsigned long long>(shared->max_device_used.load()), static_cast<unsigned long long>(quota), failed);
  return shared->over_quota_rounds.load() == 0 && failed == 0 ? 0 : 1;
}

// --- churn / killer: SIGKILL at any instruction ---------------------------

int Churn(const Driver& d) {
  Check(d.Init(0), "cuInit");
  (void)NewContext(d, 0);
  const std::uint64_t budget = Arg("bytes", 900ull << 20);
  Random rng{static_cast<std::uint64_t>(getpid())};
  std::vector<std::pair<CUdeviceptr, std::uint64_t>> held;
  std::uint64_t total = 0;
  for (;;) {
    const std::uint64_t size = (1 + rng.Below(64)) << 20;
    CUdeviceptr p = 0;
    if (total + size <= budget && d.MemAlloc(&p, size) == CUDA_SUCCESS) {
      held.push_back({p, size});
      total += size;
    } else if (!held.empty()) {
      const std::size_t i = rng.Below(held.size());
      Check(d.MemFree(held[i].first), "cuMemFree");
      total -= held[i].second;
      held.erase(held.begin() + static_cast<long>(i));
    }
  }
}

pid_t Spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ) != 0) Fail("posix_spawn");
  return pid;
}

// Kills a churning process at random moments; after each, how long until
// the memory it held can be allocated here (its reservation reclaimed).
int Killer(const Driver& d) {
  const std::uint64_t rounds = Arg("rounds", 100), quota = Arg("quota", 1000ull << 20);
  Check(d.Init(0), "cuInit");
  (void)NewContext(d, 0);
  Random rng{42};
  double worst = 0, sum = 0;
  for (std::uint64_t r = 0; r < rounds; ++r) {
    const pid_t child = Spawn({"share_probe", "churn", "--path", g_args["path"], "--bytes", std::to_string(quota)});
    std::this_thread::sleep_for(std::chrono::microseconds(20'000 + rng.Below(40'000)));
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    // The whole quota, less what this process holds (its context).
    const std::uint64_t want = quota - LedgerCharges(d, 0).process - (1 << 20);
    const double start = NowSeconds();
    CUdeviceptr p = 0;
    CUresult result = CUDA_ERROR_OUT_OF_MEMORY;
    while ((result = d.MemAlloc(&p, want)) == CUDA_ERROR_OUT_OF_MEMORY && NowSeconds() - start < 5) {
    }
    const double waited = NowSeconds() - start;
    if (result != CUDA_SUCCESS) Fail("the killed process's memory was not reclaimed within 5 s");
    Check(d.MemFree(p), "cuMemFree");
    const Charges c = LedgerCharges(d, 0);
    if (c.tenant != c.process)
      Fail("after a kill the tenant is charged " + std::to_string(c.tenant) + " but its only live process " +
           std::to_string(c.process));
    worst = std::max(worst, waited);
    sum += waited;
  }
  std::printf("{\"kills\": %llu, \"reclaim_worst_ms\": %.3f, \"reclaim_mean_ms\": %.3f}\n",
              static_cast<unsigned long long>(rounds), worst * 1e3, sum / static_cast<double>(rounds) * 1e3);
  return 0;
}

// --- report: what the process is told -------------------------------------

int Report(const Driver& d) {
  Check(d.Init(0), "cuInit");
  (void)NewContext(d, 0);
  const Charges before = LedgerCharges(d, 0);
  CUdeviceptr p = 0;
  Check(d.MemAlloc(&p, 256ull << 20), "cuMemAlloc");
  size_t free_bytes = 0, total = 0, physical = 0;
  Check(d.MemGetInfo(&free_bytes, &total), "cuMemGetInfo");
  CUdevice dev = 0;
  Check(d.DeviceGet(&dev, 0), "cuDeviceGet");
  Check(d.DeviceTotalMem(&physical, dev), "cuDeviceTotalMem");
  const Charges c = LedgerCharges(d, 0);
  // NULL-safe: either pointer may be missing.
  size_t only_total = 0, only_free = 0;
  Check(d.MemGetInfo(nullptr, &only_total), "cuMemGetInfo(NULL, &total)");
  Check(d.MemGetInfo(&only_free, nullptr), "cuMemGetInfo(&free, NULL)");
  Check(d.MemGetInfo(nullptr, nullptr), "cuMemGetInfo(NULL, NULL)");
  // NVML, as nvidia-smi's library answers a program that asks it.
  unsigned long long nvml_total = 0, nvml_free = 0, nvml_used = 0;
  int nvml = 0;
  if (void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW)) {
    using InitFn = nvmlReturn_t (*)();
    using ByIndexFn = nvmlReturn_t (*)(unsigned, nvmlDevice_t*);
    using InfoFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*);
    auto init = reinterpret_cast<InitFn>(dlsym(lib, "nvmlInit_v2"));
    auto by_index = reinterpret_cast<ByIndexFn>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    auto info = reinterpret_cast<InfoFn>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
    nvmlDevice_t device = nullptr;
    nvmlMemory_t m{};
    if (init && by_index && info && init() == 0 && by_index(static_cast<unsigned>(PhysicalOf(d, 0)), &device) == 0 &&
        info(device, &m) == 0) {
      nvml = 1;
      nvml_total = m.total, nvml_free = m.free, nvml_used = m.used;
    }
  }
  std::printf(
      "{\"free\": %zu, \"total\": %zu, \"device_total\": %zu, \"quota\": %llu, \"tenant\": %llu, "
      "\"before_alloc\": %llu, \"only_total\": %zu, \"only_free\": %zu, \"nvml\": %d, \"nvml_total\": %llu, "
      "\"nvml_free\": %llu, \"nvml_used\": %llu, \"physical_free\": %llu}\n",
      free_bytes, total, physical, static_cast<unsigned long long>(c.quota), static_cast<unsigned long long>(c.tenant),
      static_cast<unsigned long long>(before.tenant), only_total, only_free, nvml, nvml_total, nvml_free, nvml_used,
      static_cast<unsigned long long>(16ull * (1ull << 30) - FakeDeviceUsed(PhysicalOf(d, 0))));
  return 0;
}

// --- fork: a child is its own process in the ledger -----------------------

int Fork(const Driver& d) {
  Check(d.Init(0), "cuInit");
  (void)NewContext(d, 0);
  CUdeviceptr p = 0;
  Check(d.MemAlloc(&p, 100ull << 20), "cuMemAlloc");
  const Charges parent = LedgerCharges(d, 0);
  const pid_t pid = fork();
  if (pid == 0) {
    const Charges inherited = LedgerCharges(d, 0);
    (void)NewContext(d, 0);
    CUdeviceptr q = 0;
    Check(d.MemAlloc(&q, 50ull << 20), "cuMemAlloc in the child");
    const Charges child = LedgerCharges(d, 0);
    const std::uint64_t fake = FakeProcessUsed(PhysicalOf(d, 0));
    if (inherited.process != 0) Fail("a forked child started with the parent's charge");
    if (child.process != fake)
      Fail("the child is charged " + std::to_string(child.process) + ", holds " + std::to_string(fake));
    if (child.tenant != parent.process + child.process) Fail("the tenant does not add the parent and the child");
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Fail("the forked child failed");
  const Charges after = LedgerCharges(d, 0);
  if (after.process != parent.process || after.tenant != parent.process)
    Fail("after the child: parent " + std::to_string(after.process) + ", tenant " + std::to_string(after.tenant) +
         " (was " + std::to_string(parent.process) + ")");
  // fork + exec: a new program, a new process in the ledger.
  const pid_t exec_child = Spawn({"share_probe", "alloc", "--path", g_args["path"], "--bytes", "1048576"});
  waitpid(exec_child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Fail("the exec'd child failed");
  std::printf("{\"fork\": \"ok\", \"parent\": %llu}\n", static_cast<unsigned long long>(parent.process));
  return 0;
}

// A process forked without exec that never calls CUDA (a data-loading
// worker) outlives its parent, which is SIGKILLed holding 3 GiB of a 4 GiB
// quota: the parent's charge must be freed at once, not pinned by the child.
int Orphan(const Driver& d) {
  int ready[2];
  if (pipe(ready) != 0) Fail("pipe");
  const pid_t parent = fork();
  if (parent == 0) {
    Check(d.Init(0), "cuInit in the parent");
    (void)NewContext(d, 0);
    CUdeviceptr p = 0;
    Check(d.MemAlloc(&p, 3ull << 30), "cuMemAlloc in the parent");
    if (fork() == 0) {
      // The worker says it is there: its fork handlers have run by now.
      const pid_t self = getpid();
      (void)!write(ready[1], &self, sizeof(self));
      for (;;) pause();
    }
    for (;;) pause();
  }
  pid_t worker = 0;
  if (read(ready[0], &worker, sizeof(worker)) != static_cast<ssize_t>(sizeof(worker))) Fail("the parent failed");
  kill(parent, SIGKILL);
  waitpid(parent, nullptr, 0);
  Check(d.Init(0), "cuInit");
  (void)NewContext(d, 0);
  CUdeviceptr p = 0;
  const CUresult r = d.MemAlloc(&p, 3ull << 30);
  kill(worker, SIGKILL);
  if (r != CUDA_SUCCESS)
    Fail("a killed parent's 3 GiB stayed charged while its forked worker lived (cuMemAlloc returned " +
         std::to_string(static_cast<int>(r)) + ")");
  std::printf("{\"orphan\": \"ok\"}\n");
  return 0;
}

// cuCtxSetLimit's malloc heap: admitted for its size, charged what the
// device gave, given back when it shrinks and with its context.
int Limit(const Driver& d) {
  using SetLimitFn = CUresult (*)(CUlimit, size_t);
  auto set = reinterpret_cast<SetLimitFn>(dlsym(RTLD_DEFAULT, "cuCtxSetLimit"));
  if (set == nullptr) Fail("no cuCtxSetLimit");
  Check(d.Init(0), "cuInit");
  const CUcontext ctx = NewContext(d, 0);
  const int physical = PhysicalOf(d, 0);
  auto same = [&](const char* when) {
    const Charges c = LedgerCharges(d, 0);
    const std::uint64_t fake = FakeProcessUsed(physical);
    if (c.process != fake)
      Fail(std::string(when) + ": the ledger charges " + std::to_string(c.process) + ", the device holds " +
           std::to_string(fake));
    return c.process;
  };
  const std::uint64_t start = same("after the context");
  Check(set(CU_LIMIT_MALLOC_HEAP_SIZE, 256u << 20), "cuCtxSetLimit(heap, 256 MiB)");
  const std::uint64_t grown = same("after a 256 MiB heap");
  Check(set(CU_LIMIT_STACK_SIZE, 16u << 10), "cuCtxSetLimit(stack, 16 KiB)");
  (void)same("after 16 KiB stacks");
  const CUresult big = set(CU_LIMIT_MALLOC_HEAP_SIZE, std::size_t{4} << 30);
  (void)same("after a refused 4 GiB heap");
  Check(set(CU_LIMIT_MALLOC_HEAP_SIZE, 64u << 20), "cuCtxSetLimit(heap, 64 MiB)");
  (void)same("after shrinking the heap to 64 MiB");
  Check(d.CtxDestroy(ctx), "cuCtxDestroy");
  const std::uint64_t end = same("after the context ended");
  std::printf("{\"heap_charged\": %llu, \"big\": %d, \"after_destroy\": %llu}\n",
              static_cast<unsigned long long>(grown - start), static_cast<int>(big),
              static_cast<unsigned long long>(end));
  return 0;
}

int Alloc(const Driver& d) {
  Check(d.Init(0), "cuInit");
  (void)NewContext(d, 0);
  CUdeviceptr p = 0;
  const CUresult r = d.MemAlloc(&p, Arg("bytes", 1 << 20));
  const Charges c = LedgerCharges(d, 0);
  std::printf("{\"result\": %d, \"process\": %llu, \"quota\": %llu}\n", static_cast<int>(r),
              static_cast<unsigned long long>(c.process), static_cast<unsigned long long>(c.quota));
  return r == CUDA_SUCCESS ? 0 : 2;
}

// --- modules: admitted before the load for what the same code took -----
// Allocates --bytes, then loads the PTX text --image (its bytes are its
// key); prints what the load returned and what it took on the fake device.

int Module(const Driver& d) {
  Check(d.Init(0), "cuInit");
  (void)NewContext(d, 0);
  const int physical = PhysicalOf(d, 0);
  CUdeviceptr p = 0;
  if (Arg("bytes", 0) > 0) Check(d.MemAlloc(&p, Arg("bytes", 0)), "cuMemAlloc");
  const std::string image = g_args.count("image") ? g_args["image"] : "// fake module";
  const std::uint64_t before = FakeProcessUsed(physical);
  CUmodule m = nullptr;
  const CUresult r = d.ModuleLoadData(&m, image.c_str());
  const Charges c = LedgerCharges(d, 0);
  std::printf("{\"load\": %d, \"loaded_bytes\": %llu, \"tenant\": %llu, \"quota\": %llu}\n", static_cast<int>(r),
              static_cast<unsigned long long>(FakeProcessUsed(physical) - before),
              static_cast<unsigned long long>(c.tenant), static_cast<unsigned long long>(c.quota));
  return 0;
}

// --- arrays: what the driver says they take; sparse tiles hold handles ----

int Arrays(const Driver& d) {
  Check(d.Init(0), "cuInit");
  (void)NewContext(d, 0);
  const int physical = PhysicalOf(d, 0);
  const std::uint64_t base = LedgerCharges(d, 0).process, fake_base = FakeProcessUsed(physical);
  auto charged = [&] { return LedgerCharges(d, 0).process - base; };
  auto used = [&] { return FakeProcessUsed(physical) - fake_base; };
  // A plain array: the driver pads it (to 64 KiB tiles on the fake); its
  // elements alone are 100 x 100 x 4 = 40,000 bytes.
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  desc.Width = 100;
  desc.Height = 100;
  desc.Format = CU_AD_FORMAT_UNSIGNED_INT8;
  desc.NumChannels = 4;
  CUarray plain = nullptr;
  Check(d.Array3DCreate(&plain, &desc), "cuArray3DCreate");
  const std::uint64_t plain_charged = charged(), plain_used = used();
  // A sparse array takes nothing of its own; a handle mapped into a tile
  // stays in use after it is released, until unmapped.
  desc.Width = desc.Height = 1024;
  desc.Flags = CUDA_ARRAY3D_SPARSE;
  CUarray sparse = nullptr;
  Check(d.Array3DCreate(&sparse, &desc), "cuArray3DCreate(SPARSE)");
  const std::uint64_t sparse_charged = charged() - plain_charged;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CUmemGenericAllocationHandle handle = 0;
  Check(d.MemCreate(&handle, 2ull << 20, &prop, 0), "cuMemCreate");
  CUarrayMapInfo map{};
  map.resourceType = CU_RESOURCE_TYPE_ARRAY;
  map.resource.array = sparse;
  map.subresourceType = CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL;
  map.subresource.sparseLevel.extentWidth = map.subresource.sparseLevel.extentHeight = 256;
  map.subresource.sparseLevel.extentDepth = 1;
  map.memOperationType = CU_MEM_OPERATION_TYPE_MAP;
  map.memHandleType = CU_MEM_HANDLE_TYPE_GENERIC;
  map.memHandle.memHandle = handle;
  Check(d.MemMapArrayAsync(&map, 1, nullptr), "cuMemMapArrayAsync(MAP)");
  Check(d.MemRelease(handle), "cuMemRelease");
  const std::uint64_t released_charged = charged(), released_used = used();
  CUarrayMapInfo unmap = map;
  unmap.memOperationType = CU_MEM_OPERATION_TYPE_UNMAP;
  unmap.subresource.sparseLevel.extentWidth = unmap.subresource.sparseLevel.extentHeight = 1024;  // all of it
  Check(d.MemMapArrayAsync(&unmap, 1, nullptr), "cuMemMapArrayAsync(UNMAP)");
  const std::uint64_t unmapped_charged = charged(), unmapped_used = used();
  // Mapped again, released, and the array destroyed with the mapping on.
  Check(d.MemCreate(&handle, 2ull << 20, &prop, 0), "cuMemCreate");
  map.memHandle.memHandle = handle;
  Check(d.MemMapArrayAsync(&map, 1, nullptr), "cuMemMapArrayAsync(MAP)");
  Check(d.MemRelease(handle), "cuMemRelease");
  Check(d.ArrayDestroy(sparse), "cuArrayDestroy(SPARSE)");
  Check(d.ArrayDestroy(plain), "cuArrayDestroy");
  std::printf(
      "{\"plain_charged\": %llu, \"plain_used\": %llu, \"sparse_charged\": %llu, \"released_charged\": %llu, "
      "\"released_used\": %llu, \"unmapped_charged\": %llu, \"unmapped_used\": %llu, \"end_charged\": %llu, "
      "\"end_used\": %llu}\n",
      static_cast<unsigned long long>(plain_charged), static_cast<unsigned long long>(plain_used),
      static_cast<unsigned long long>(sparse_charged), static_cast<unsigned long long>(released_charged),
      static_cast<unsigned long long>(released_used), static_cast<unsigned long long>(unmapped_charged),
      static_cast<unsigned long long>(unmapped_used), static_cast<unsigned long long>(charged()),
      static_cast<unsigned long long>(used()));
  return 0;
}

// --- pool: admitted for what the pool grows by ------------------------------

int PoolGrowth(const Driver& d) {
  Check(d.Init(0), "cuInit");
  (void)NewContext(d, 0);
  const int physical = PhysicalOf(d, 0);
  int results[3] = {};
  const std::uint64_t sizes[3] = {1ull << 20, 20ull << 20, 20ull << 20};
  CUdeviceptr p = 0;
  std::uint64_t max_charged = 0;
  for (int i = 0; i < 3; ++i) {
    results[i] = static_cast<int>(d.MemAllocAsync(&p, sizes[i], nullptr));
    max_charged = std::max(max_charged, LedgerCharges(d, 0).process);
  }
  const Charges c = LedgerCharges(d, 0);
  std::printf(
      "{\"first\": %d, \"second\": %d, \"third\": %d, \"charged\": %llu, \"max_charged\": %llu, \"used\": %llu, "
      "\"quota\": %llu}\n",
      results[0], results[1], results[2], static_cast<unsigned long long>(c.process),
      static_cast<unsigned long long>(max_charged), static_cast<unsigned long long>(FakeProcessUsed(physical)),
      static_cast<unsigned long long>(c.quota));
  return 0;
}

// --- graphs: memory nodes' reservation read after their launches ---------

int Graphs(const Driver& d) {
  Check(d.Init(0), "cuInit");
  (void)NewContext(d, 0);
  const int physical = PhysicalOf(d, 0);
  using Queries = long (*)();
  // The fake driver counts reads of the graph reservation; a real one does
  // not (-1 reported).
  const auto queries = reinterpret_cast<Queries>(dlsym(RTLD_DEFAULT, "fake_cuda_graph_mem_queries"));
  auto instantiate = [&](std::uint64_t bytes) {
    CUgraph g = nullptr;
    Check(d.GraphCreate(&g, 0), "cuGraphCreate");
    if (bytes > 0) {
      CUDA_MEM_ALLOC_NODE_PARAMS params{};
      params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
      params.poolProps.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
      params.bytesize = bytes;
      CUgraphNode node = nullptr;
      Check(d.GraphAddMemAllocNode(&node, g, nullptr, 0, &params), "cuGraphAddMemAllocNode");
    }
    CUgraphExec exec = nullptr;
    Check(d.GraphInstantiate(&exec, g, 0), "cuGraphInstantiateWithFlags");
    return exec;
  };
  // A graph whose memory nodes pass the quota (--over BYTES): refused
  // before it runs.
  if (const std::uint64_t over = Arg("over", 0); over > 0) {
    const CUresult refused = d.GraphLaunch(instantiate(over), nullptr);
    std::printf("{\"over_result\": %d, \"charged\": %llu, \"used\": %llu}\n", static_cast<int>(refused),
                static_cast<unsigned long long>(LedgerCharges(d, 0).process),
                static_cast<unsigned long long>(FakeProcessUsed(physical)));
    return 0;
  }
  // Two graphs of --concurrent BYTES each, launched into two streams so
  // that they run at once (the fake: FAKE_CUDA_GRAPH_US), then again one
  // after the other on one stream.
  if (const std::uint64_t each = Arg("concurrent", 0); each > 0) {
    CUstream one = nullptr, two = nullptr;
    Check(d.StreamCreate(&one, 0), "cuStreamCreate");
    Check(d.StreamCreate(&two, 0), "cuStreamCreate");
    const CUgraphExec a = instantiate(each), b = instantiate(each);
    Check(d.GraphLaunch(a, one), "cuGraphLaunch");
    const CUresult beside = d.GraphLaunch(b, two);
    std::uint64_t max_charged = LedgerCharges(d, 0).process;
    Check(d.StreamSynchronize(one), "cuStreamSynchronize");
    Check(d.StreamSynchronize(two), "cuStreamSynchronize");
    const CUresult after = d.GraphLaunch(b, one);
    max_charged = std::max(max_charged, LedgerCharges(d, 0).process);
    Check(d.StreamSynchronize(one), "cuStreamSynchronize");
    const Charges c = LedgerCharges(d, 0);
    std::printf(
        "{\"beside_result\": %d, \"after_result\": %d, \"max_charged\": %llu, \"charged\": %llu, "
        "\"used\": %llu, \"quota\": %llu}\n",
        static_cast<int>(beside), static_cast<int>(after), static_cast<unsigned long long>(max_charged),
        static_cast<unsigned long long>(c.process), static_cast<unsigned long long>(FakeProcessUsed(physical)),
        static_cast<unsigned long long>(c.quota));
    return 0;
  }
  const CUgraphExec small = instantiate(100ull << 20), big = instantiate(300ull << 20), none = instantiate(0);
  // Two launches in a row, the second growing the reservation: each is
  // read after its launch (before, at most one read every 5 ms).
  Check(d.GraphLaunch(small, nullptr), "cuGraphLaunch");
  Check(d.GraphLaunch(big, nullptr), "cuGraphLaunch");
  const Charges after_big = LedgerCharges(d, 0);
  const std::uint64_t used_after_big = FakeProcessUsed(physical);
  // A graph without memory nodes reads nothing, however often it runs.
  const long before_none = queries ? queries() : 0;
  for (int i = 0; i < 1000; ++i) Check(d.GraphLaunch(none, nullptr), "cuGraphLaunch");
  const long none_reads = queries ? queries() - before_none : -1;
  std::printf("{\"charged\": %llu, \"used\": %llu, \"reads_for_1000_launches_without_memory\": %ld}\n",
              static_cast<unsigned long long>(after_big.process), static_cast<unsigned long long>(used_after_big),
              none_reads);
  return 0;
}

// --- visible: CUDA_VISIBLE_DEVICES maps ordinals to devices ----------------

int Visible(const Driver& d) {
  Check(d.Init(0), "cuInit");
  int count = 0;
  Check(d.DeviceGetCount(&count), "cuDeviceGetCount");
  (void)NewContext(d, 0);
  CUdeviceptr p = 0;
  const CUresult big = d.MemAlloc(&p, Arg("big", 1536ull << 20));
  if (big == CUDA_SUCCESS) Check(d.MemFree(p), "cuMemFree");
  const CUresult small = d.MemAlloc(&p, 512ull << 20);
  const Charges c = LedgerCharges(d, 0);
  std::printf(
      "{\"devices\": %d, \"ordinal0_physical\": %d, \"big\": %d, \"small\": %d, \"quota\": %llu, "
      "\"process\": %llu, \"fake_used\": %llu}\n",
      count, PhysicalOf(d, 0), static_cast<int>(big), static_cast<int>(small), static_cast<unsigned long long>(c.quota),
      static_cast<unsigned long long>(c.process), static_cast<unsigned long long>(FakeProcessUsed(PhysicalOf(d, 0))));
  return 0;
}

}  // namespace

int Bench(const Driver& d);
int Compute(const Driver& d);
int Collective(const Driver& d);
int Capture(const Driver& d);
int InContainer(const Driver& d);
int Resolve();

}  // namespace probe

int main(int argc, char** argv) {
  using namespace probe;
  if (argc < 2) {
    std::fprintf(stderr, "usage: share_probe MODE [--path direct|dlsym|proc] [--name value]...\n");
    return 2;
  }
  const std::string mode = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) g_args[std::string(argv[i]).substr(2)] = argv[i + 1];
  if (!g_args.count("path")) g_args["path"] = "direct";
  if (mode == "resolve") return Resolve();
  Path path;
  if (!ParsePath(g_args["path"], &path)) Fail("unknown --path " + g_args["path"]);
  Driver d;
  std::string error;
  if (!LoadDriver(path, static_cast<int>(Arg("version", 0)), &d, &error)) Fail(error);
  if (mode == "property") return RunProperty(d, Arg("ops", 10000), Arg("seed", 1));
  if (mode == "race") return Race(d);
  if (mode == "churn") return Churn(d);
  if (mode == "killer") return Killer(d);
  if (mode == "report") return Report(d);
  if (mode == "fork") return Fork(d);
  if (mode == "alloc") return Alloc(d);
  if (mode == "module") return Module(d);
  if (mode == "orphan") return Orphan(d);
  if (mode == "limit") return Limit(d);
  if (mode == "visible") return Visible(d);
  if (mode == "arrays") return Arrays(d);
  if (mode == "graphs") return Graphs(d);
  if (mode == "pool") return PoolGrowth(d);
  if (mode == "bench") return Bench(d);
  if (mode == "compute") return Compute(d);
  if (mode == "collective") return Collective(d);
  if (mode == "capture") return Capture(d);
  if (mode == "in-container") return InContainer(d);
  Fail("unknown mode " + mode);
}
