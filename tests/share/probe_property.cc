// The accounting property: after every one of many random operations over
// every allocation API (on two devices, with contexts coming and going and
// a quota that refuses some), the ledger's charge for this process equals
// what the fake device holds for it, and an allocation the quota admits
// never leaves the tenant over it.
#include <algorithm>
#include <cstring>
#include <vector>

#include "probe_util.h"

namespace probe {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

struct Owned {
  CUcontext ctx;
  int ordinal;
  bool primary = false;
};

class Property {
 public:
  Property(const Driver& d, std::uint64_t seed) : d_(d), rng_{seed} {
    Check(d_.DeviceGetCount(&devices_), "cuDeviceGetCount");
    devices_ = std::min(devices_, 2);
  }

  int Run(std::uint64_t ops) {
    // Start with a context on each device.
    for (int o = 0; o < devices_; ++o) NewContext(o);
    for (std::uint64_t i = 0; i < ops; ++i) {
      op_ = i;
      Step();
      Verify();
    }
    std::printf(
        "property: %llu operations, %llu admitted, %llu refused over the quota, %llu checks equal; "
        "{\"checks\": %llu, \"beyond_tolerance\": %llu, \"worst_difference\": %llu, \"tolerance\": %llu}\n",
        static_cast<unsigned long long>(ops), static_cast<unsigned long long>(admitted_),
        static_cast<unsigned long long>(refused_), static_cast<unsigned long long>(checks_ - off_),
        static_cast<unsigned long long>(checks_), static_cast<unsigned long long>(off_),
        static_cast<unsigned long long>(worst_), static_cast<unsigned long long>(tolerance_));
    return off_ == 0 ? 0 : 1;
  }

 private:
  void NewContext(int ordinal) {
    CUdevice dev = 0;
    Check(d_.DeviceGet(&dev, ordinal), "cuDeviceGet");
    CUcontext ctx = nullptr;
    if (d_.CtxCreate(&ctx, 0, dev) != CUDA_SUCCESS) return;  // over the device: fine
    contexts_.push_back({ctx, ordinal});
  }
  // Makes a random live context current; its ordinal, or -1.
  int UseSomeContext() {
    if (contexts_.empty()) return -1;
    const Owned& c = contexts_[rng_.Below(contexts_.size())];
    Check(d_.CtxSetCurrent(c.ctx), "cuCtxSetCurrent");
    current_ = c;
    return c.ordinal;
  }
  // Everything made in `ctx` went with it.
  void DropOwnedBy(CUcontext ctx) {
    auto gone = [ctx](const auto& e) { return e.owner.ctx == ctx; };
    std::erase_if(plain_, gone);
    std::erase_if(arrays_, gone);
    std::erase_if(mipmapped_, gone);
    std::erase_if(modules_, gone);
    std::erase_if(libraries_, gone);
  }

  std::uint64_t Size() {
    switch (rng_.Below(8)) {
      case 0:
      case 1:
        return 1 + rng_.Below(64 * 1024);
      case 2:
      case 3:
        return kMiB + rng_.Below(16 * kMiB);
      case 4:
      case 5:
      case 6:
        return 64 * kMiB + rng_.Below(192 * kMiB);
      default:
        return 512 * kMiB + rng_.Below(1024 * kMiB);
    }
  }

  // An allocation the quota decides: admitted ones must leave the tenant
  // within it.
  void Admitted(CUresult r, int ordinal) {
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      ++refused_;
      GiveBack();
      return;
    }
    if (r == CUDA_ERROR_INVALID_VALUE && !OnFakeDriver()) return;  // a real driver refusing a shape
    Check(r, "an admitted allocation");
    ++admitted_;
    const Charges c = LedgerCharges(d_, ordinal);
    if (c.tenant > c.quota)
      Fail("operation " + std::to_string(op_) + " (kind " + std::to_string(kind_) +
           "): admitted, and the tenant is now at " + std::to_string(c.tenant) + " bytes, over its quota of " +
           std::to_string(c.quota));
  }

  // What a caching allocator does on an out-of-memory error: frees some of
  // what it holds before trying again.
  void GiveBack() {
    for (int i = 0; i < 3; ++i) {
      if (!plain_.empty()) {
        const Plain p = plain_.back();
        plain_.pop_back();
        Check(p.async ? d_.MemFreeAsync(p.ptr, nullptr) : d_.MemFree(p.ptr), "free");
      }
      if (!pooled_.empty()) {
        Check(d_.MemFreeAsync(pooled_.back(), nullptr), "cuMemFreeAsync");
        pooled_.pop_back();
      }
      if (!mappings_.empty()) {
        Check(d_.MemUnmap(mappings_.back().first, mappings_.back().second), "cuMemUnmap");
        mappings_.pop_back();
      }
      if (!handles_.empty()) {
        Check(d_.MemRelease(handles_.back().first), "cuMemRelease");
        handles_.pop_back();
      }
      if (!arrays_.empty()) {
        Check(d_.ArrayDestroy(arrays_.back().handle), "cuArrayDestroy");
        arrays_.pop_back();
      }
    }
  }

  void Step() {
    const int ordinal = UseSomeContext();
    const std::uint64_t kind = rng_.Below(30);
    kind_ = kind;
    if (ordinal < 0 || kind == 0) {
      NewContext(static_cast<int>(rng_.Below(devices_)));
      return;
    }
    switch (kind) {
      case 1: {  // a context ends, with what it holds
        if (contexts_.size() <= 1) return;
        const std::size_t i = rng_.Below(contexts_.size());
        if (contexts_[i].primary) return;
        Check(d_.CtxDestroy(contexts_[i].ctx), "cuCtxDestroy");
        DropOwnedBy(contexts_[i].ctx);
        contexts_.erase(contexts_.begin() + static_cast<long>(i));
        if (!contexts_.empty()) Check(d_.CtxSetCurrent(contexts_[0].ctx), "cuCtxSetCurrent");
        return;
      }
      case 2:
      case 3:
      case 4: {
        CUdeviceptr p = 0;
        const CUresult r = d_.MemAlloc(&p, Size());
        Admitted(r, ordinal);
        if (r == CUDA_SUCCESS) plain_.push_back({p, current_, false});
        return;
      }
      case 5: {
        CUdeviceptr p = 0;
        size_t pitch = 0;
        const CUresult r = d_.MemAllocPitch(&p, &pitch, 1 + rng_.Below(8192), 1 + rng_.Below(8192), 4);
        Admitted(r, ordinal);
        if (r == CUDA_SUCCESS) plain_.push_back({p, current_, false});
        return;
      }
      case 6: {
        CUdeviceptr p = 0;
        const CUresult r = d_.MemAllocManaged(&p, Size(), CU_MEM_ATTACH_GLOBAL);
        Admitted(r, ordinal);
        if (r == CUDA_SUCCESS) plain_.push_back({p, current_, false});
        return;
      }
      case 7:
      case 8:
      case 9: {
        if (plain_.empty()) return;
        const std::size_t i = rng_.Below(plain_.size());
        Check(plain_[i].async ? d_.MemFreeAsync(plain_[i].ptr, nullptr) : d_.MemFree(plain_[i].ptr), "free");
        plain_.erase(plain_.begin() + static_cast<long>(i));
        return;
      }
      case 10: {  // stream-ordered, from the device's pool
        if (!d_.MemAllocAsync) return;
        CUdeviceptr p = 0;
        const CUresult r = d_.MemAllocAsync(&p, Size(), nullptr);
        if (r == CUDA_ERROR_OUT_OF_MEMORY) return void(++refused_);
        Check(r, "cuMemAllocAsync");
        pooled_.push_back(p);
        return;
      }
      case 11:
      case 12: {
        if (pooled_.empty()) return;
        const std::size_t i = rng_.Below(pooled_.size());
        Check(d_.MemFreeAsync(pooled_[i], nullptr), "cuMemFreeAsync");
        pooled_.erase(pooled_.begin() + static_cast<long>(i));
        return;
      }
      case 13: {  // a pool of our own, allocations from it, trims, its end
        if (!d_.PoolCreate) return;
        if (pools_.size() < 3 && rng_.Below(2)) {
          CUmemPoolProps props{};
          props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
          props.location = {CU_MEM_LOCATION_TYPE_DEVICE, ordinal};
          CUmemoryPool pool = nullptr;
          Check(d_.PoolCreate(&pool, &props), "cuMemPoolCreate");
          pools_.push_back(pool);
        } else if (!pools_.empty()) {
          const std::size_t i = rng_.Below(pools_.size());
          std::erase_if(pool_allocs_, [&](const auto& a) { return a.second == pools_[i]; });
          Check(d_.PoolDestroy(pools_[i]), "cuMemPoolDestroy");
          pools_.erase(pools_.begin() + static_cast<long>(i));
        }
        return;
      }
      case 14: {
        if (pools_.empty()) return;
        CUmemoryPool pool = pools_[rng_.Below(pools_.size())];
        CUdeviceptr p = 0;
        const CUresult r = d_.MemAllocFromPoolAsync(&p, Size() / 4, pool, nullptr);
        if (r == CUDA_ERROR_OUT_OF_MEMORY) return void(++refused_);
        Check(r, "cuMemAllocFromPoolAsync");
        pool_allocs_.push_back({p, pool});
        return;
      }
      case 15: {
        if (pool_allocs_.empty()) return;
        const std::size_t i = rng_.Below(pool_allocs_.size());
        Check(d_.MemFreeAsync(pool_allocs_[i].first, nullptr), "cuMemFreeAsync");
        pool_allocs_.erase(pool_allocs_.begin() + static_cast<long>(i));
        return;
      }
      case 16: {
        if (pools_.empty()) return;
        CUmemoryPool pool = pools_[rng_.Below(pools_.size())];
        if (rng_.Below(2)) {
          Check(d_.PoolTrimTo(pool, rng_.Below(64 * kMiB)), "cuMemPoolTrimTo");
        } else {
          cuuint64_t threshold = rng_.Below(256 * kMiB);
          Check(d_.PoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold), "cuMemPoolSetAttribute");
        }
        return;
      }
      case 17: {  // VMM: a handle on this device
        if (!d_.MemCreate) return;
        CUmemAllocationProp prop{};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location = {rng_.Below(8) ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST, ordinal};
        CUmemGenericAllocationHandle h = 0;
        const std::uint64_t bytes = (1 + rng_.Below(256)) * 2 * kMiB;
        const CUresult r = d_.MemCreate(&h, bytes, &prop, 0);
        if (prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE)
          Admitted(r, ordinal);
        else
          Check(r, "cuMemCreate on the host");
        if (r == CUDA_SUCCESS) handles_.push_back({h, bytes});
        return;
      }
      case 18: {  // map, and sometimes retain or import another reference
        if (handles_.empty()) return;
        const auto [h, bytes] = handles_[rng_.Below(handles_.size())];
        CUdeviceptr va = 0;
        Check(d_.AddressReserve(&va, bytes, 0, 0, 0), "cuMemAddressReserve");
        Check(d_.MemMap(va, bytes, 0, h, 0), "cuMemMap");
        mappings_.push_back({va, bytes});
        if (rng_.Below(3) == 0) {
          CUmemGenericAllocationHandle again = 0;
          Check(d_.MemRetain(&again, reinterpret_cast<void*>(va)), "cuMemRetainAllocationHandle");
          handles_.push_back({again, bytes});
        } else if (rng_.Below(3) == 0) {
          int shared = 0;
          if (d_.MemExport(&shared, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != CUDA_SUCCESS) return;
          CUmemGenericAllocationHandle imported = 0;
          Check(d_.MemImport(&imported, reinterpret_cast<void*>(static_cast<std::intptr_t>(shared)),
                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                "cuMemImportFromShareableHandle");
          handles_.push_back({imported, bytes});
        }
        return;
      }
      case 19: {  // a release (one reference) or an unmap
        if (!handles_.empty() && rng_.Below(2)) {
          const std::size_t i = rng_.Below(handles_.size());
          Check(d_.MemRelease(handles_[i].first), "cuMemRelease");
          handles_.erase(handles_.begin() + static_cast<long>(i));
        } else if (!mappings_.empty()) {
          const std::size_t i = rng_.Below(mappings_.size());
          Check(d_.MemUnmap(mappings_[i].first, mappings_[i].second), "cuMemUnmap");
          mappings_.erase(mappings_.begin() + static_cast<long>(i));
        }
        return;
      }
      case 20: {  // arrays
        CUarray a = nullptr;
        CUresult r;
        const CUarray_format formats[] = {CU_AD_FORMAT_UNSIGNED_INT8, CU_AD_FORMAT_HALF, CU_AD_FORMAT_FLOAT};
        if (rng_.Below(2)) {
          CUDA_ARRAY_DESCRIPTOR desc{};
          desc.Width = 1 + rng_.Below(8192);
          desc.Height = rng_.Below(8192);
          desc.Format = formats[rng_.Below(3)];
          desc.NumChannels = 1u << rng_.Below(3);
          r = d_.ArrayCreate(&a, &desc);
        } else {
          CUDA_ARRAY3D_DESCRIPTOR desc{};
          desc.Width = 1 + rng_.Below(1024);
          desc.Height = rng_.Below(1024);
          desc.Depth = desc.Height ? rng_.Below(256) : 0;
          desc.Format = formats[rng_.Below(3)];
          desc.NumChannels = 1u << rng_.Below(3);
          r = d_.Array3DCreate(&a, &desc);
        }
        Admitted(r, ordinal);
        if (r == CUDA_SUCCESS) arrays_.push_back({a, current_});
        return;
      }
      case 21: {
        if (d_.MipmappedCreate && rng_.Below(2)) {
          CUDA_ARRAY3D_DESCRIPTOR desc{};
          desc.Width = 1 + rng_.Below(4096);
          desc.Height = 1 + rng_.Below(4096);
          desc.Format = CU_AD_FORMAT_FLOAT;
          desc.NumChannels = 4;
          CUmipmappedArray m = nullptr;
          const CUresult r = d_.MipmappedCreate(&m, &desc, 1 + static_cast<unsigned>(rng_.Below(8)));
          Admitted(r, ordinal);
          if (r == CUDA_SUCCESS) mipmapped_.push_back({m, current_});
        } else if (!arrays_.empty()) {
          const std::size_t i = rng_.Below(arrays_.size());
          Check(d_.ArrayDestroy(arrays_[i].handle), "cuArrayDestroy");
          arrays_.erase(arrays_.begin() + static_cast<long>(i));
        }
        return;
      }
      case 22: {
        if (mipmapped_.empty()) return;
        const std::size_t i = rng_.Below(mipmapped_.size());
        Check(d_.MipmappedDestroy(mipmapped_[i].handle), "cuMipmappedArrayDestroy");
        mipmapped_.erase(mipmapped_.begin() + static_cast<long>(i));
        return;
      }
      case 23: {  // modules and libraries: measured
        static const char image[] = "fake module";
        if (rng_.Below(2) || !d_.LibraryLoadData) {
          CUmodule m = nullptr;
          if (d_.ModuleLoadData(&m, image) == CUDA_SUCCESS) modules_.push_back({m, current_});
        } else {
          CUlibrary l = nullptr;
          if (d_.LibraryLoadData(&l, image, nullptr, nullptr, 0, nullptr, nullptr, 0) == CUDA_SUCCESS)
            libraries_.push_back({l, current_});
        }
        return;
      }
      case 24: {
        if (!modules_.empty() && rng_.Below(2)) {
          const std::size_t i = rng_.Below(modules_.size());
          Check(d_.ModuleUnload(modules_[i].handle), "cuModuleUnload");
          modules_.erase(modules_.begin() + static_cast<long>(i));
        } else if (!libraries_.empty()) {
          const std::size_t i = rng_.Below(libraries_.size());
          Check(d_.LibraryUnload(libraries_[i].handle), "cuLibraryUnload");
          libraries_.erase(libraries_.begin() + static_cast<long>(i));
        }
        return;
      }
      case 25: {  // graph memory: a graph with a memory node, launched
        if (!d_.GraphCreate || !d_.GraphAddMemAllocNode) return;
        CUgraph g = nullptr;
        Check(d_.GraphCreate(&g, 0), "cuGraphCreate");
        CUDA_MEM_ALLOC_NODE_PARAMS params{};
        params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        params.poolProps.location = {CU_MEM_LOCATION_TYPE_DEVICE, ordinal};
        params.bytesize = Size() / 4;
        CUgraphNode node = nullptr;
        if (d_.GraphAddMemAllocNode(&node, g, nullptr, 0, &params) != CUDA_SUCCESS) {
          Check(d_.GraphDestroy(g), "cuGraphDestroy");
          return;
        }
        CUgraphExec exec = nullptr;
        Check(d_.GraphInstantiate(&exec, g, 0), "cuGraphInstantiateWithFlags");
        Check(d_.GraphDestroy(g), "cuGraphDestroy");
        const CUresult r = d_.GraphLaunch(exec, nullptr);
        if (r != CUDA_ERROR_OUT_OF_MEMORY) Check(r, "cuGraphLaunch");
        Check(d_.GraphExecDestroy(exec), "cuGraphExecDestroy");
        return;
      }
      case 26: {
        if (!d_.GraphMemTrim) return;
        CUdevice dev = 0;
        Check(d_.DeviceGet(&dev, ordinal), "cuDeviceGet");
        Check(d_.GraphMemTrim(dev), "cuDeviceGraphMemTrim");
        return;
      }
      case 27: {  // the primary context: retained, released, reset
        CUdevice dev = 0;
        Check(d_.DeviceGet(&dev, ordinal), "cuDeviceGet");
        const std::uint64_t what = rng_.Below(3);
        if (what == 0 || primary_refs_[ordinal] == 0) {
          CUcontext p = nullptr;
          if (d_.PrimaryRetain(&p, dev) == CUDA_SUCCESS) {
            ++primary_refs_[ordinal];
            primary_[ordinal] = p;
            if (primary_refs_[ordinal] == 1) contexts_.push_back({p, ordinal, true});  // allocate in it too
          }
        } else {
          CUcontext p = primary_[ordinal];
          Check(what == 1 ? d_.PrimaryRelease(dev) : d_.PrimaryReset(dev), "primary release/reset");
          if (what == 2 || --primary_refs_[ordinal] == 0) {
            primary_refs_[ordinal] = 0;
            DropOwnedBy(p);
            std::erase_if(contexts_, [p](const Owned& c) { return c.ctx == p; });
            if (!contexts_.empty()) Check(d_.CtxSetCurrent(contexts_[0].ctx), "cuCtxSetCurrent");
          }
        }
        return;
      }
      case 28: {  // host memory never counts
        void* h = nullptr;
        Check(d_.MemAllocHost(&h, 1 + rng_.Below(kMiB)), "cuMemAllocHost");  // real host memory: kept small
        Check(d_.MemFreeHost(h), "cuMemFreeHost");
        return;
      }
      default: {  // what the process is told
        size_t free_bytes = 0, total = 0;
        Check(d_.MemGetInfo(&free_bytes, &total), "cuMemGetInfo");
        const Charges c = LedgerCharges(d_, ordinal);
        CUdevice dev = 0;
        size_t physical = 0;
        Check(d_.DeviceGet(&dev, ordinal), "cuDeviceGet");
        Check(d_.DeviceTotalMem(&physical, dev), "cuDeviceTotalMem");
        if (total != std::min<std::uint64_t>(c.quota, physical) || free_bytes > total)
          Fail("cuMemGetInfo says " + std::to_string(free_bytes) + " free of " + std::to_string(total) +
               " with a quota of " + std::to_string(c.quota));
        return;
      }
    }
  }

  void Verify() {
    for (int o = 0; o < devices_; ++o) {
      const Charges c = LedgerCharges(d_, o);
      const std::uint64_t fake = FakeProcessUsed(PhysicalOf(d_, o));
      // Equal on the fake; on a real driver within its granularity
      // (PROBE_TOLERANCE_BYTES, the GPU check sets it).
      const std::uint64_t diff = c.process > fake ? c.process - fake : fake - c.process;
      if (diff > tolerance_) ++off_;
      if (diff > tolerance_ && OnFakeDriver())
        Fail("after operation " + std::to_string(op_) + " (kind " + std::to_string(kind_) + "): the ledger charges " +
             std::to_string(c.process) + " bytes on device " + std::to_string(o) + ", the device holds " +
             std::to_string(fake));
      ++checks_;
      worst_ = std::max(worst_, diff);
    }
  }

  template <typename H>
  struct Made {
    H handle;
    Owned owner;
  };
  struct Plain {
    CUdeviceptr ptr;
    Owned owner;
    bool async;
  };

  const Driver& d_;
  Random rng_;
  int devices_ = 0;
  std::uint64_t tolerance_ =
      std::getenv("PROBE_TOLERANCE_BYTES") ? std::strtoull(std::getenv("PROBE_TOLERANCE_BYTES"), nullptr, 10) : 0;
  std::uint64_t off_ = 0, worst_ = 0;
  std::uint64_t op_ = 0, kind_ = 0, admitted_ = 0, refused_ = 0, checks_ = 0;
  Owned current_{};
  std::vector<Owned> contexts_;
  int primary_refs_[2] = {};
  CUcontext primary_[2] = {};
  std::vector<Plain> plain_;
  std::vector<CUdeviceptr> pooled_;
  std::vector<CUmemoryPool> pools_;
  std::vector<std::pair<CUdeviceptr, CUmemoryPool>> pool_allocs_;
  std::vector<std::pair<CUmemGenericAllocationHandle, std::uint64_t>> handles_;
  std::vector<std::pair<CUdeviceptr, std::uint64_t>> mappings_;
  std::vector<Made<CUarray>> arrays_;
  std::vector<Made<CUmipmappedArray>> mipmapped_;
  std::vector<Made<CUmodule>> modules_;
  std::vector<Made<CUlibrary>> libraries_;
};

}  // namespace

int RunProperty(const Driver& d, std::uint64_t ops, std::uint64_t seed) {
  Check(d.Init(0), "cuInit");
  return Property(d, seed).Run(ops);
}

}  // namespace probe
