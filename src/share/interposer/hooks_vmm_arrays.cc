// VMM handles (counted once when created on a device, released with their
// last reference: the creation, each mapping, each retain, each import of
// a handle this process made) and arrays (charged what the driver says
// they take).
#include <algorithm>

#include "share/interposer/hook_prologue.h"

using stoker::share::Dev;
using stoker::share::Interposer;

namespace {

// Drops one reference to `handle`; the last gives its memory back. Lock held.
void DropReference(Interposer& ip, CUmemGenericAllocationHandle handle) {
  auto it = ip.handles.find(handle);
  if (it == ip.handles.end()) return;
  if (--it->second.refs > 0) return;
  ip.Untrack(it->second.dev, it->second.bytes);
  ip.handles.erase(it);
}

void AddReference(Interposer& ip, CUmemGenericAllocationHandle handle) {
  auto it = ip.handles.find(handle);
  if (it != ip.handles.end()) ++it->second.refs;
}

}  // namespace

STOKER_HOOK CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t bytes,
                                         const CUmemAllocationProp* prop, unsigned long long flags) {
  STOKER_PROLOGUE(cuMemCreate, PFN_cuMemCreate_v10020)
  Dev dev;
  // Only memory on a device counts; host-located handles are host memory.
  if (prop == nullptr || bytes == 0 || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      !ip.DeviceOf(prop->location.id, &dev))
    return real(handle, bytes, prop, flags);
  if (!ip.Admit(dev, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  CUmemGenericAllocationHandle h = 0;
  const CUresult r = real(&h, bytes, prop, flags);
  if (r != CUDA_SUCCESS) {
    ip.ledger().Uncharge(dev.ledger, bytes);
    return r;
  }
  if (handle) *handle = h;
  std::lock_guard<std::mutex> lock(ip.mu);
  ip.Track(dev, bytes);
  ip.handles[h] = {dev, bytes, 1};
  return r;
}

STOKER_HOOK CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  STOKER_PROLOGUE(cuMemRelease, PFN_cuMemRelease_v10020)
  const CUresult r = real(handle);
  if (r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> lock(ip.mu);
  DropReference(ip, handle);
  return r;
}

STOKER_HOOK CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                                      unsigned long long flags) {
  STOKER_PROLOGUE(cuMemMap, PFN_cuMemMap_v10020)
  const CUresult r = real(ptr, size, offset, handle, flags);
  if (r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> lock(ip.mu);
  AddReference(ip, handle);
  ip.mappings[ptr] = {handle, size};
  return r;
}

STOKER_HOOK CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  STOKER_PROLOGUE(cuMemUnmap, PFN_cuMemUnmap_v10020)
  const CUresult r = real(ptr, size);
  if (r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> lock(ip.mu);
  // Every mapping that starts inside [ptr, ptr + size) goes with it.
  for (auto it = ip.mappings.lower_bound(ptr); it != ip.mappings.end() && it->first < ptr + size;) {
    DropReference(ip, it->second.first);
    it = ip.mappings.erase(it);
  }
  return r;
}

STOKER_HOOK CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* address) {
  STOKER_PROLOGUE(cuMemRetainAllocationHandle, PFN_cuMemRetainAllocationHandle_v11000)
  const CUresult r = real(handle, address);
  if (r != CUDA_SUCCESS || handle == nullptr) return r;
  std::lock_guard<std::mutex> lock(ip.mu);
  AddReference(ip, *handle);
  return r;
}

// An imported handle of memory this process created is another reference
// to it; memory from another process is that process's charge.
STOKER_HOOK CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* shared,
                                                            CUmemAllocationHandleType type) {
  STOKER_PROLOGUE(cuMemImportFromShareableHandle, PFN_cuMemImportFromShareableHandle_v10020)
  const CUresult r = real(handle, shared, type);
  if (r != CUDA_SUCCESS || handle == nullptr) return r;
  std::lock_guard<std::mutex> lock(ip.mu);
  AddReference(ip, *handle);
  return r;
}

// --- arrays ---

namespace {

std::uint64_t ElementBytes(CUarray_format format) {
  switch (format) {
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

std::uint64_t Estimate(std::uint64_t w, std::uint64_t h, std::uint64_t d, CUarray_format f, unsigned channels) {
  return w * std::max<std::uint64_t>(h, 1) * std::max<std::uint64_t>(d, 1) * std::max(channels, 1u) * ElementBytes(f);
}

// Creates an array through `create` after admitting `estimate`, then
// charges what the driver says it takes (cuArrayGetMemoryRequirements),
// destroying it again if that does not fit.
template <typename Handle, typename Create, typename Requirements, typename Destroy>
CUresult CreateArray(Interposer& ip, std::uint64_t estimate, Handle* out, Create create, Requirements requirements,
                     Destroy destroy) {
  Dev dev;
  CUcontext ctx = nullptr;
  if (estimate == 0 || !ip.CurrentDevice(&dev, &ctx)) return create(out);
  if (!ip.Admit(dev, estimate)) return CUDA_ERROR_OUT_OF_MEMORY;
  Handle array{};
  const CUresult r = create(&array);
  if (r != CUDA_SUCCESS) {
    ip.ledger().Uncharge(dev.ledger, estimate);
    return r;
  }
  std::uint64_t bytes = estimate;
  CUDA_ARRAY_MEMORY_REQUIREMENTS req{};
  CUdevice device = 0;
  if (ip.driver().device_get(&device, dev.ordinal) == CUDA_SUCCESS && requirements(&req, array, device))
    bytes = req.size;
  if (bytes > estimate && !ip.Admit(dev, bytes - estimate, /*in_flight=*/true)) {
    (void)destroy(array);
    ip.ledger().Uncharge(dev.ledger, estimate);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (bytes < estimate) ip.ledger().Uncharge(dev.ledger, estimate - bytes);
  if (out) *out = array;
  std::lock_guard<std::mutex> lock(ip.mu);
  ip.Track(dev, bytes);
  ip.arrays[reinterpret_cast<void*>(array)] = {ctx, dev, bytes};
  return r;
}

template <typename Handle, typename Destroy>
CUresult DestroyArray(Interposer& ip, Handle array, Destroy destroy) {
  const CUresult r = destroy();
  if (r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> lock(ip.mu);
  auto it = ip.arrays.find(reinterpret_cast<void*>(array));
  if (it != ip.arrays.end()) {
    ip.Untrack(it->second.dev, it->second.bytes);
    ip.arrays.erase(it);
  }
  return r;
}

bool ArrayRequirements(Interposer& ip, CUDA_ARRAY_MEMORY_REQUIREMENTS* req, CUarray a, CUdevice d) {
  return ip.driver().array_requirements && ip.driver().array_requirements(req, a, d) == CUDA_SUCCESS;
}
bool MipmappedRequirements(Interposer& ip, CUDA_ARRAY_MEMORY_REQUIREMENTS* req, CUmipmappedArray a, CUdevice d) {
  return ip.driver().mipmapped_requirements && ip.driver().mipmapped_requirements(req, a, d) == CUDA_SUCCESS;
}
CUresult DestroyCreated(Interposer& ip, CUarray a) {
  return ip.driver().array_destroy ? ip.driver().array_destroy(a) : CUDA_ERROR_NOT_FOUND;
}

}  // namespace

STOKER_HOOK CUresult CUDAAPI cuArrayCreate_v2(CUarray* array, const CUDA_ARRAY_DESCRIPTOR* d) {
  STOKER_PROLOGUE(cuArrayCreate_v2, PFN_cuArrayCreate_v3020)
  if (d == nullptr) return real(array, d);
  return CreateArray(
      ip, Estimate(d->Width, d->Height, 1, d->Format, d->NumChannels), array, [&](CUarray* a) { return real(a, d); },
      [&](auto* req, CUarray a, CUdevice dev) { return ArrayRequirements(ip, req, a, dev); },
      [&](CUarray a) { return DestroyCreated(ip, a); });
}

STOKER_HOOK CUresult CUDAAPI cuArrayCreate(CUarray* array, const CUDA_ARRAY_DESCRIPTOR_v1* d) {
  STOKER_PROLOGUE(cuArrayCreate, PFN_cuArrayCreate_v2000)
  if (d == nullptr) return real(array, d);
  return CreateArray(
      ip, Estimate(d->Width, d->Height, 1, d->Format, d->NumChannels), array, [&](CUarray* a) { return real(a, d); },
      [&](auto* req, CUarray a, CUdevice dev) { return ArrayRequirements(ip, req, a, dev); },
      [&](CUarray a) { return DestroyCreated(ip, a); });
}

STOKER_HOOK CUresult CUDAAPI cuArray3DCreate_v2(CUarray* array, const CUDA_ARRAY3D_DESCRIPTOR* d) {
  STOKER_PROLOGUE(cuArray3DCreate_v2, PFN_cuArray3DCreate_v3020)
  if (d == nullptr) return real(array, d);
  return CreateArray(
      ip, Estimate(d->Width, d->Height, d->Depth, d->Format, d->NumChannels), array,
      [&](CUarray* a) { return real(a, d); },
      [&](auto* req, CUarray a, CUdevice dev) { return ArrayRequirements(ip, req, a, dev); },
      [&](CUarray a) { return DestroyCreated(ip, a); });
}

STOKER_HOOK CUresult CUDAAPI cuArray3DCreate(CUarray* array, const CUDA_ARRAY3D_DESCRIPTOR_v1* d) {
  STOKER_PROLOGUE(cuArray3DCreate, PFN_cuArray3DCreate_v2000)
  if (d == nullptr) return real(array, d);
  return CreateArray(
      ip, Estimate(d->Width, d->Height, d->Depth, d->Format, d->NumChannels), array,
      [&](CUarray* a) { return real(a, d); },
      [&](auto* req, CUarray a, CUdevice dev) { return ArrayRequirements(ip, req, a, dev); },
      [&](CUarray a) { return DestroyCreated(ip, a); });
}

STOKER_HOOK CUresult CUDAAPI cuArrayDestroy(CUarray array) {
  STOKER_PROLOGUE(cuArrayDestroy, PFN_cuArrayDestroy_v2000)
  return DestroyArray(ip, array, [&] { return real(array); });
}

STOKER_HOOK CUresult CUDAAPI cuMipmappedArrayCreate(CUmipmappedArray* array, const CUDA_ARRAY3D_DESCRIPTOR* d,
                                                    unsigned int levels) {
  STOKER_PROLOGUE(cuMipmappedArrayCreate, PFN_cuMipmappedArrayCreate_v5000)
  if (d == nullptr) return real(array, d, levels);
  // The estimate: every level, each half the size of the one above.
  std::uint64_t estimate = 0, w = d->Width, h = d->Height, z = d->Depth;
  for (unsigned l = 0; l < levels && l < 32; ++l) {
    estimate += Estimate(w, h, z, d->Format, d->NumChannels);
    w = std::max<std::uint64_t>(1, w / 2);
    h = h ? std::max<std::uint64_t>(1, h / 2) : 0;
    z = z ? std::max<std::uint64_t>(1, z / 2) : 0;
  }
  return CreateArray(
      ip, estimate, array, [&](CUmipmappedArray* a) { return real(a, d, levels); },
      [&](auto* req, CUmipmappedArray a, CUdevice dev) { return MipmappedRequirements(ip, req, a, dev); },
      [&](CUmipmappedArray a) {
        return ip.driver().mipmapped_destroy ? ip.driver().mipmapped_destroy(a) : CUDA_ERROR_NOT_FOUND;
      });
}

STOKER_HOOK CUresult CUDAAPI cuMipmappedArrayDestroy(CUmipmappedArray array) {
  STOKER_PROLOGUE(cuMipmappedArrayDestroy, PFN_cuMipmappedArrayDestroy_v5000)
  return DestroyArray(ip, array, [&] { return real(array); });
}
