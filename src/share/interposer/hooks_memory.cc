// Device memory: plain, pitched and managed allocations, stream-ordered
// allocations and pools, VMM handles, arrays. Each hook reserves in the
// ledger before the driver allocates (admission), and commits on success or
// rolls back on failure; frees give back exactly what was charged.
#include <algorithm>

#include "share/interposer/hook_prologue.h"
#include "share/interposer/pool_probe.h"

using stoker::share::Dev;
using stoker::share::Interposer;
using stoker::share::kMaxOrdinals;
using stoker::share::MeasurePoolChunk;

namespace {

// A plain allocation of `bytes` on the current device through `allocate`.
template <typename Allocate>
CUresult AllocatePlain(Interposer& ip, std::uint64_t bytes, Allocate allocate) {
  Dev dev;
  CUcontext ctx = nullptr;
  if (bytes == 0 || !ip.CurrentDevice(&dev, &ctx)) return allocate(nullptr);  // the driver says why
  if (!ip.Admit(dev, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  CUdeviceptr ptr = 0;
  const CUresult r = allocate(&ptr);
  if (r != CUDA_SUCCESS) {
    ip.ledger().Uncharge(dev.ledger, bytes);
    return r;
  }
  std::lock_guard<std::mutex> lock(ip.mu);
  ip.Track(dev, bytes);
  ip.allocations[ptr] = {ctx, dev, bytes};
  return r;
}

// Frees `ptr` through `release`; the record goes first, so that an address
// the driver hands out again at once is not confused with the freed one.
template <typename Release>
CUresult FreePlain(Interposer& ip, CUdeviceptr ptr, Release release) {
  Interposer::Block block;
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(ip.mu);
    auto it = ip.allocations.find(ptr);
    if (it != ip.allocations.end()) {
      block = it->second;
      known = true;
      ip.allocations.erase(it);
    }
  }
  const CUresult r = release();
  std::lock_guard<std::mutex> lock(ip.mu);
  if (known && r == CUDA_SUCCESS) {
    ip.Untrack(block.dev, block.bytes);
  } else if (known) {
    ip.allocations[ptr] = block;
  }
  return r;
}

}  // namespace

STOKER_HOOK CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  STOKER_PROLOGUE(cuMemAlloc_v2, PFN_cuMemAlloc_v3020)
  return AllocatePlain(ip, bytes, [&](CUdeviceptr* p) {
    const CUresult r = real(p ? p : dptr, bytes);
    if (p && r == CUDA_SUCCESS && dptr) *dptr = *p;
    return r;
  });
}

STOKER_HOOK CUresult CUDAAPI cuMemAlloc(CUdeviceptr_v1* dptr, unsigned int bytes) {
  STOKER_PROLOGUE(cuMemAlloc, PFN_cuMemAlloc_v2000)
  return AllocatePlain(ip, bytes, [&](CUdeviceptr* p) {
    CUdeviceptr_v1 v1 = 0;
    const CUresult r = real(p ? &v1 : dptr, bytes);
    if (p && r == CUDA_SUCCESS) {
      *p = v1;
      if (dptr) *dptr = v1;
    }
    return r;
  });
}

namespace {

// The pitch's padding, known only after the call, passes admission too;
// false (the reservation returned) when it does not fit.
bool SettlePadding(Interposer& ip, const Dev& dev, std::uint64_t estimate, std::uint64_t bytes) {
  if (bytes > estimate && !ip.Admit(dev, bytes - estimate, /*in_flight=*/true)) {
    ip.ledger().Uncharge(dev.ledger, estimate);
    return false;
  }
  if (bytes < estimate) ip.ledger().Uncharge(dev.ledger, estimate - bytes);
  return true;
}

}  // namespace

STOKER_HOOK CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                                unsigned int element) {
  STOKER_PROLOGUE(cuMemAllocPitch_v2, PFN_cuMemAllocPitch_v3020)
  auto free = stoker::share::Real<PFN_cuMemFree_v3020>(stoker::share::kV_cuMemFree_v2);
  Dev dev;
  CUcontext ctx = nullptr;
  // Admission on the unpadded size; the driver's pitch is settled after.
  const std::uint64_t estimate = static_cast<std::uint64_t>(width) * height;
  if (estimate == 0 || free == nullptr || !ip.CurrentDevice(&dev, &ctx))
    return real(dptr, pitch, width, height, element);
  if (!ip.Admit(dev, estimate)) return CUDA_ERROR_OUT_OF_MEMORY;
  CUdeviceptr ptr = 0;
  size_t p = 0;
  const CUresult r = real(&ptr, &p, width, height, element);
  if (r != CUDA_SUCCESS) {
    ip.ledger().Uncharge(dev.ledger, estimate);
    return r;
  }
  const std::uint64_t bytes = static_cast<std::uint64_t>(p) * height;
  if (!SettlePadding(ip, dev, estimate, bytes)) {
    (void)free(ptr);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (dptr) *dptr = ptr;
  if (pitch) *pitch = p;
  std::lock_guard<std::mutex> lock(ip.mu);
  ip.Track(dev, bytes);
  ip.allocations[ptr] = {ctx, dev, bytes};
  return r;
}

STOKER_HOOK CUresult CUDAAPI cuMemAllocPitch(CUdeviceptr_v1* dptr, unsigned int* pitch, unsigned int width,
                                             unsigned int height, unsigned int element) {
  STOKER_PROLOGUE(cuMemAllocPitch, PFN_cuMemAllocPitch_v2000)
  auto free = stoker::share::Real<PFN_cuMemFree_v2000>(stoker::share::kV_cuMemFree);
  Dev dev;
  CUcontext ctx = nullptr;
  const std::uint64_t estimate = static_cast<std::uint64_t>(width) * height;
  if (estimate == 0 || free == nullptr || !ip.CurrentDevice(&dev, &ctx))
    return real(dptr, pitch, width, height, element);
  if (!ip.Admit(dev, estimate)) return CUDA_ERROR_OUT_OF_MEMORY;
  CUdeviceptr_v1 ptr = 0;
  unsigned int p = 0;
  const CUresult r = real(&ptr, &p, width, height, element);
  if (r != CUDA_SUCCESS) {
    ip.ledger().Uncharge(dev.ledger, estimate);
    return r;
  }
  const std::uint64_t bytes = static_cast<std::uint64_t>(p) * height;
  if (!SettlePadding(ip, dev, estimate, bytes)) {
    (void)free(ptr);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (dptr) *dptr = ptr;
  if (pitch) *pitch = p;
  std::lock_guard<std::mutex> lock(ip.mu);
  ip.Track(dev, bytes);
  ip.allocations[ptr] = {ctx, dev, bytes};
  return r;
}

// Managed memory may all become resident on the device: it is counted as
// device memory (docs/gpu-sharing.md).
STOKER_HOOK CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr* dptr, size_t bytes, unsigned int flags) {
  STOKER_PROLOGUE(cuMemAllocManaged, PFN_cuMemAllocManaged_v6000)
  return AllocatePlain(ip, bytes, [&](CUdeviceptr* p) {
    const CUresult r = real(p ? p : dptr, bytes, flags);
    if (p && r == CUDA_SUCCESS && dptr) *dptr = *p;
    return r;
  });
}

STOKER_HOOK CUresult CUDAAPI cuMemFree_v2(CUdeviceptr ptr) {
  STOKER_PROLOGUE(cuMemFree_v2, PFN_cuMemFree_v3020)
  return FreePlain(ip, ptr, [&] { return real(ptr); });
}

STOKER_HOOK CUresult CUDAAPI cuMemFree(CUdeviceptr_v1 ptr) {
  STOKER_PROLOGUE(cuMemFree, PFN_cuMemFree_v2000)
  return FreePlain(ip, ptr, [&] { return real(ptr); });
}

// --- stream-ordered allocations: a pool is charged its reservation ---

namespace {

// The pool `pool` (registering it: device `dev`, or found among the
// devices' default pools). Lock held.
Interposer::Pool& PoolRecord(Interposer& ip, CUmemoryPool pool, const Dev& dev) {
  auto it = ip.pools.find(pool);
  if (it != ip.pools.end()) return it->second;
  Interposer::Pool& p = ip.pools[pool];
  p.dev = dev;
  return p;
}

// The chunk a fresh pool on `dev` grows by (pool_probe.h), measured on the
// first pool allocation on the device; 0 when it cannot be measured.
std::uint64_t FreshPoolChunk(Interposer& ip, const Dev& dev) {
  if (dev.ordinal < 0 || static_cast<std::uint32_t>(dev.ordinal) >= kMaxOrdinals) return 0;
  std::lock_guard<std::mutex> probing(ip.pool_probe_mu);
  {
    std::lock_guard<std::mutex> lock(ip.mu);
    if (ip.pool_chunk_measured[dev.ordinal]) return ip.pool_chunk[dev.ordinal];
  }
  const std::uint64_t chunk = MeasurePoolChunk(dev.ordinal);
  std::lock_guard<std::mutex> lock(ip.mu);
  ip.pool_chunk_measured[dev.ordinal] = true;
  ip.pool_chunk[dev.ordinal] = chunk;
  return chunk;
}

// Allocates from `pool` through `allocate`: admitted for what the pool must
// grow by (nothing while its free reservation holds the request: that is
// charged already; else the shortfall in the chunks the pool grows by: the
// smallest growth seen on this pool, or before any, what a fresh pool on
// the device was measured to reserve), then the pool's reservation (what
// the driver holds) charged. Where the pool cannot be read, the request
// itself is admitted and charged.
template <typename Allocate>
CUresult AllocateFromPool(Interposer& ip, CUmemoryPool pool, const Dev& current, std::uint64_t bytes,
                          Allocate allocate) {
  bool device = true;
  Dev dev;  // the pool's device, which need not be the current one
  std::uint64_t chunk = 0;
  {
    std::lock_guard<std::mutex> lock(ip.mu);
    const Interposer::Pool& record = PoolRecord(ip, pool, current);
    device = record.device;
    dev = record.dev;
    chunk = record.chunk;
  }
  if (!device) return allocate();  // a host pool
  const auto get = ip.driver().pool_get_attribute;
  cuuint64_t reserved_before = 0, used_before = 0;
  const bool known = get && get(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved_before) == CUDA_SUCCESS &&
                     get(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used_before) == CUDA_SUCCESS;
  const std::uint64_t free_before = reserved_before > used_before ? reserved_before - used_before : 0;
  const std::uint64_t shortfall = known ? (bytes > free_before ? bytes - free_before : 0) : bytes;
  // The probe needs a context on the pool's device: the current one.
  if (known && shortfall > 0 && chunk == 0 && dev.ordinal == current.ordinal) chunk = FreshPoolChunk(ip, dev);
  const std::uint64_t growth = known && chunk > 0 ? (shortfall + chunk - 1) / chunk * chunk : shortfall;
  if (growth > 0 && !ip.Admit(dev, growth)) return CUDA_ERROR_OUT_OF_MEMORY;
  CUdeviceptr ptr = 0;
  const CUresult r = allocate(&ptr);
  cuuint64_t reserved = 0;
  const bool read = get && get(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) == CUDA_SUCCESS;
  std::lock_guard<std::mutex> lock(ip.mu);
  Interposer::Pool& p = PoolRecord(ip, pool, dev);
  if (read) {
    // The reservation replaces what was charged for the pool; this call's
    // admission reservation goes.
    ip.ledger().Settle(p.dev.ledger, p.charged + growth, reserved);
    ip.tracked[p.dev.ordinal] = ip.tracked[p.dev.ordinal] - std::min(p.charged, ip.tracked[p.dev.ordinal]) + reserved;
    p.charged = reserved;
    const std::uint64_t grown = reserved > reserved_before ? reserved - reserved_before : 0;
    if (known && r == CUDA_SUCCESS && shortfall > 0 && grown >= shortfall && (p.chunk == 0 || grown < p.chunk))
      p.chunk = grown;
  } else if (r == CUDA_SUCCESS) {
    ip.Track(dev, growth);  // cannot read the pool: the request stands in
    p.charged += growth;
  } else if (growth > 0) {
    ip.ledger().Uncharge(dev.ledger, growth);
  }
  if (r == CUDA_SUCCESS) ip.pooled[ptr] = pool;
  return r;
}

template <typename Pfn>
CUresult AllocAsync(Interposer& ip, Pfn real, CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  Dev dev;
  CUmemoryPool pool = nullptr;
  if (bytes == 0 || !ip.CurrentDevice(&dev) || ip.driver().device_get_mem_pool == nullptr ||
      ip.driver().device_get_mem_pool(&pool, dev.ordinal) != CUDA_SUCCESS)
    return real(dptr, bytes, stream);
  return AllocateFromPool(ip, pool, dev, bytes, [&](CUdeviceptr* p = nullptr) {
    const CUresult r = real(p ? p : dptr, bytes, stream);
    if (p && r == CUDA_SUCCESS && dptr) *dptr = *p;
    return r;
  });
}

template <typename Pfn>
CUresult AllocFromPool(Interposer& ip, Pfn real, CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUstream stream) {
  Dev dev;
  if (bytes == 0 || pool == nullptr || !ip.CurrentDevice(&dev)) return real(dptr, bytes, pool, stream);
  // A pool created before it was seen (a device's default pool): find its device.
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(ip.mu);
    known = ip.pools.count(pool) != 0;
  }
  if (!known && ip.driver().device_get_default_mem_pool) {
    int count = 0;
    (void)ip.driver().device_get_count(&count);
    for (int o = 0; o < count; ++o) {
      CUmemoryPool p = nullptr;
      Dev d;
      if (ip.driver().device_get_default_mem_pool(&p, o) == CUDA_SUCCESS && p == pool && ip.DeviceOf(o, &d)) dev = d;
    }
  }
  return AllocateFromPool(ip, pool, dev, bytes, [&](CUdeviceptr* p = nullptr) {
    const CUresult r = real(p ? p : dptr, bytes, pool, stream);
    if (p && r == CUDA_SUCCESS && dptr) *dptr = *p;
    return r;
  });
}

// After a pool changed (free, trim, threshold): charge its reservation.
void RefreshPool(Interposer& ip, CUmemoryPool pool) {
  cuuint64_t reserved = 0;
  if (pool == nullptr || ip.driver().pool_get_attribute == nullptr ||
      ip.driver().pool_get_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != CUDA_SUCCESS)
    return;
  std::lock_guard<std::mutex> lock(ip.mu);
  auto it = ip.pools.find(pool);
  if (it == ip.pools.end() || !it->second.device) return;
  Interposer::Pool& p = it->second;
  ip.ledger().Settle(p.dev.ledger, p.charged, reserved);
  ip.tracked[p.dev.ordinal] = ip.tracked[p.dev.ordinal] - std::min(p.charged, ip.tracked[p.dev.ordinal]) + reserved;
  p.charged = reserved;
}

template <typename Free>
CUresult FreeAsync(Interposer& ip, CUdeviceptr ptr, Free free) {
  CUmemoryPool pool = nullptr;
  {
    std::lock_guard<std::mutex> lock(ip.mu);
    auto it = ip.pooled.find(ptr);
    if (it != ip.pooled.end()) {
      pool = it->second;
      ip.pooled.erase(it);
    }
  }
  if (pool == nullptr) return FreePlain(ip, ptr, free);  // a plain allocation freed in stream order
  const CUresult r = free();
  if (r != CUDA_SUCCESS) {
    std::lock_guard<std::mutex> lock(ip.mu);
    ip.pooled[ptr] = pool;
    return r;
  }
  RefreshPool(ip, pool);
  return r;
}

}  // namespace

STOKER_HOOK CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  STOKER_PROLOGUE(cuMemAllocAsync, PFN_cuMemAllocAsync_v11020)
  return AllocAsync(ip, real, dptr, bytes, stream);
}
STOKER_HOOK CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytes, CUstream stream) {
  STOKER_PROLOGUE(cuMemAllocAsync_ptsz, PFN_cuMemAllocAsync_v11020_ptsz)
  return AllocAsync(ip, real, dptr, bytes, stream);
}
STOKER_HOOK CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool,
                                                     CUstream stream) {
  STOKER_PROLOGUE(cuMemAllocFromPoolAsync, PFN_cuMemAllocFromPoolAsync_v11020)
  return AllocFromPool(ip, real, dptr, bytes, pool, stream);
}
STOKER_HOOK CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool,
                                                          CUstream stream) {
  STOKER_PROLOGUE(cuMemAllocFromPoolAsync_ptsz, PFN_cuMemAllocFromPoolAsync_v11020_ptsz)
  return AllocFromPool(ip, real, dptr, bytes, pool, stream);
}
STOKER_HOOK CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr ptr, CUstream stream) {
  STOKER_PROLOGUE(cuMemFreeAsync, PFN_cuMemFreeAsync_v11020)
  return FreeAsync(ip, ptr, [&] { return real(ptr, stream); });
}
STOKER_HOOK CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr ptr, CUstream stream) {
  STOKER_PROLOGUE(cuMemFreeAsync_ptsz, PFN_cuMemFreeAsync_v11020_ptsz)
  return FreeAsync(ip, ptr, [&] { return real(ptr, stream); });
}

STOKER_HOOK CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  STOKER_PROLOGUE(cuMemPoolCreate, PFN_cuMemPoolCreate_v11020)
  const CUresult r = real(pool, props);
  if (r != CUDA_SUCCESS || pool == nullptr || props == nullptr) return r;
  Interposer::Pool record;
  record.device = props->location.type == CU_MEM_LOCATION_TYPE_DEVICE;
  if (record.device && !ip.DeviceOf(props->location.id, &record.dev)) record.device = false;
  std::lock_guard<std::mutex> lock(ip.mu);
  ip.pools[*pool] = record;
  return r;
}

STOKER_HOOK CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool) {
  STOKER_PROLOGUE(cuMemPoolDestroy, PFN_cuMemPoolDestroy_v11020)
  const CUresult r = real(pool);
  if (r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> lock(ip.mu);
  auto it = ip.pools.find(pool);
  if (it != ip.pools.end()) {
    if (it->second.device) ip.Untrack(it->second.dev, it->second.charged);
    ip.pools.erase(it);
  }
  for (auto p = ip.pooled.begin(); p != ip.pooled.end();) p = p->second == pool ? ip.pooled.erase(p) : std::next(p);
  return r;
}

STOKER_HOOK CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
  STOKER_PROLOGUE(cuMemPoolTrimTo, PFN_cuMemPoolTrimTo_v11020)
  const CUresult r = real(pool, keep);
  if (r == CUDA_SUCCESS) RefreshPool(ip, pool);
  return r;
}

STOKER_HOOK CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attribute, void* value) {
  STOKER_PROLOGUE(cuMemPoolSetAttribute, PFN_cuMemPoolSetAttribute_v11020)
  const CUresult r = real(pool, attribute, value);
  if (r == CUDA_SUCCESS) RefreshPool(ip, pool);
  return r;
}
