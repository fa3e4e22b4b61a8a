// VMM handles (counted once when created on a device, released with their
// last reference: the creation, each mapping (cuMemMap, or into a sparse
// array's tiles by cuMemMapArrayAsync), each retain, each import of a
// handle this process made) and arrays (charged what the driver says an
// array of their shape takes; sparse and deferred-mapping arrays take
// nothing of their own).
#include <algorithm>
#include <tuple>

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

// Sparse and deferred-mapping arrays: a handle mapped into a tile is
// another reference to it (memory released while mapped stays in use);
// unmapping the tiles, or destroying the array, drops it.
namespace {

std::array<std::uint64_t, 6> TileKey(const CUarrayMapInfo& m) {
  if (m.subresourceType == CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL)
    return {1, m.subresource.miptail.layer, m.subresource.miptail.offset, 0, 0, 0};
  const auto& l = m.subresource.sparseLevel;
  return {0, l.layer, l.level, l.offsetX, l.offsetY, l.offsetZ};
}

// Whether the tile at `key` lies in what `m` unmaps. Lock held.
bool Covers(const CUarrayMapInfo& m, const std::array<std::uint64_t, 6>& key) {
  if (m.subresourceType == CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL) {
    const auto& t = m.subresource.miptail;
    return key[0] == 1 && key[1] == t.layer && key[2] >= t.offset &&
           key[2] < t.offset + std::max<std::uint64_t>(t.size, 1);
  }
  const auto& l = m.subresource.sparseLevel;
  auto within = [](std::uint64_t at, std::uint64_t from, std::uint64_t extent) {
    return at >= from && at < from + std::max<std::uint64_t>(extent, 1);
  };
  return key[0] == 0 && key[1] == l.layer && key[2] == l.level && within(key[3], l.offsetX, l.extentWidth) &&
         within(key[4], l.offsetY, l.extentHeight) && within(key[5], l.offsetZ, l.extentDepth);
}

void NoteArrayMaps(Interposer& ip, const CUarrayMapInfo* list, unsigned int count) {
  std::lock_guard<std::mutex> lock(ip.mu);
  for (unsigned int i = 0; i < count; ++i) {
    const CUarrayMapInfo& m = list[i];
    void* resource = m.resourceType == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY ? static_cast<void*>(m.resource.mipmap)
                                                                        : static_cast<void*>(m.resource.array);
    auto& tiles = ip.array_maps[resource];
    if (m.memOperationType == CU_MEM_OPERATION_TYPE_MAP && m.memHandleType == CU_MEM_HANDLE_TYPE_GENERIC) {
      const CUmemGenericAllocationHandle handle = m.memHandle.memHandle;
      AddReference(ip, handle);
      auto [at, added] = tiles.emplace(TileKey(m), handle);
      if (!added) {  // mapped over: the handle there loses its mapping
        DropReference(ip, at->second);
        at->second = handle;
      }
    } else if (m.memOperationType == CU_MEM_OPERATION_TYPE_UNMAP) {
      for (auto it = tiles.begin(); it != tiles.end();) {
        if (!Covers(m, it->first)) {
          ++it;
          continue;
        }
        DropReference(ip, it->second);
        it = tiles.erase(it);
      }
    }
    if (tiles.empty()) ip.array_maps.erase(resource);
  }
}

}  // namespace

STOKER_HOOK CUresult CUDAAPI cuMemMapArrayAsync(CUarrayMapInfo* list, unsigned int count, CUstream stream) {
  STOKER_PROLOGUE(cuMemMapArrayAsync, PFN_cuMemMapArrayAsync_v11010)
  const CUresult r = real(list, count, stream);
  if (r == CUDA_SUCCESS && list != nullptr) NoteArrayMaps(ip, list, count);
  return r;
}
STOKER_HOOK CUresult CUDAAPI cuMemMapArrayAsync_ptsz(CUarrayMapInfo* list, unsigned int count, CUstream stream) {
  STOKER_PROLOGUE(cuMemMapArrayAsync_ptsz, PFN_cuMemMapArrayAsync_v11010_ptsz)
  const CUresult r = real(list, count, stream);
  if (r == CUDA_SUCCESS && list != nullptr) NoteArrayMaps(ip, list, count);
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

// An array's shape, as the driver is asked about it.
struct Shape {
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  unsigned levels = 0;  // mipmapped: its levels; 0: a plain array
  auto Key(int ordinal) const {
    return std::make_tuple(ordinal, desc.Width, desc.Height, desc.Depth, static_cast<int>(desc.Format),
                           desc.NumChannels, desc.Flags, levels);
  }
};

// What an array of `shape` takes on the current context's device (0: the
// driver cannot tell). cuArrayGetMemoryRequirements answers only for arrays
// made with CUDA_ARRAY3D_DEFERRED_MAPPING, which take no memory until
// mapped: a deferred twin of the shape is made, asked and destroyed, once
// per shape and device, then remembered.
std::uint64_t DriverSize(Interposer& ip, const Dev& dev, const Shape& shape) {
  static std::mutex mu;
  static std::map<decltype(shape.Key(0)), std::uint64_t> sizes;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = sizes.find(shape.Key(dev.ordinal)); it != sizes.end()) return it->second;
  }
  const stoker::share::DriverCalls& d = ip.driver();
  CUDA_ARRAY3D_DESCRIPTOR twin_desc = shape.desc;
  twin_desc.Flags |= CUDA_ARRAY3D_DEFERRED_MAPPING;
  CUDA_ARRAY_MEMORY_REQUIREMENTS req{};
  CUdevice device = 0;
  std::uint64_t size = 0;
  if (d.device_get(&device, dev.ordinal) == CUDA_SUCCESS) {
    if (shape.levels == 0 && d.array3d_create && d.array_requirements && d.array_destroy) {
      CUarray twin = nullptr;
      if (d.array3d_create(&twin, &twin_desc) == CUDA_SUCCESS) {
        if (d.array_requirements(&req, twin, device) == CUDA_SUCCESS) size = req.size;
        (void)d.array_destroy(twin);
      }
    } else if (shape.levels > 0 && d.mipmapped_create && d.mipmapped_requirements && d.mipmapped_destroy) {
      CUmipmappedArray twin = nullptr;
      if (d.mipmapped_create(&twin, &twin_desc, shape.levels) == CUDA_SUCCESS) {
        if (d.mipmapped_requirements(&req, twin, device) == CUDA_SUCCESS) size = req.size;
        (void)d.mipmapped_destroy(twin);
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  sizes[shape.Key(dev.ordinal)] = size;
  return size;
}

// Creates an array of `shape` through `create`: sparse and deferred-mapping
// arrays as they are (what is mapped into them is charged with its
// handle); others after admitting what the driver says such an array
// takes, or `estimate` (their elements, unpadded) where it cannot say.
template <typename Handle, typename Create>
CUresult CreateArray(Interposer& ip, const Shape& shape, std::uint64_t estimate, Handle* out, Create create) {
  Dev dev;
  CUcontext ctx = nullptr;
  if ((shape.desc.Flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)) || !ip.CurrentDevice(&dev, &ctx))
    return create(out);
  const std::uint64_t sized = DriverSize(ip, dev, shape);
  const std::uint64_t bytes = sized != 0 ? sized : estimate;
  if (bytes == 0) return create(out);
  if (!ip.Admit(dev, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  Handle array{};
  const CUresult r = create(&array);
  if (r != CUDA_SUCCESS) {
    ip.ledger().Uncharge(dev.ledger, bytes);
    return r;
  }
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
  // The handles mapped into its tiles lose those mappings.
  if (auto maps = ip.array_maps.find(reinterpret_cast<void*>(array)); maps != ip.array_maps.end()) {
    for (const auto& [tile, handle] : maps->second) DropReference(ip, handle);
    ip.array_maps.erase(maps);
  }
  return r;
}

Shape PlainShape(std::size_t w, std::size_t h, std::size_t d, CUarray_format format, unsigned channels,
                 unsigned flags) {
  Shape shape;
  shape.desc.Width = w;
  shape.desc.Height = h;
  shape.desc.Depth = d;
  shape.desc.Format = format;
  shape.desc.NumChannels = channels;
  shape.desc.Flags = flags;
  return shape;
}

}  // namespace

STOKER_HOOK CUresult CUDAAPI cuArrayCreate_v2(CUarray* array, const CUDA_ARRAY_DESCRIPTOR* d) {
  STOKER_PROLOGUE(cuArrayCreate_v2, PFN_cuArrayCreate_v3020)
  if (d == nullptr) return real(array, d);
  return CreateArray(ip, PlainShape(d->Width, d->Height, 0, d->Format, d->NumChannels, 0),
                     Estimate(d->Width, d->Height, 1, d->Format, d->NumChannels), array,
                     [&](CUarray* a) { return real(a, d); });
}

STOKER_HOOK CUresult CUDAAPI cuArrayCreate(CUarray* array, const CUDA_ARRAY_DESCRIPTOR_v1* d) {
  STOKER_PROLOGUE(cuArrayCreate, PFN_cuArrayCreate_v2000)
  if (d == nullptr) return real(array, d);
  return CreateArray(ip, PlainShape(d->Width, d->Height, 0, d->Format, d->NumChannels, 0),
                     Estimate(d->Width, d->Height, 1, d->Format, d->NumChannels), array,
                     [&](CUarray* a) { return real(a, d); });
}

STOKER_HOOK CUresult CUDAAPI cuArray3DCreate_v2(CUarray* array, const CUDA_ARRAY3D_DESCRIPTOR* d) {
  STOKER_PROLOGUE(cuArray3DCreate_v2, PFN_cuArray3DCreate_v3020)
  if (d == nullptr) return real(array, d);
  return CreateArray(ip, PlainShape(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags),
                     Estimate(d->Width, d->Height, d->Depth, d->Format, d->NumChannels), array,
                     [&](CUarray* a) { return real(a, d); });
}

STOKER_HOOK CUresult CUDAAPI cuArray3DCreate(CUarray* array, const CUDA_ARRAY3D_DESCRIPTOR_v1* d) {
  STOKER_PROLOGUE(cuArray3DCreate, PFN_cuArray3DCreate_v2000)
  if (d == nullptr) return real(array, d);
  return CreateArray(ip, PlainShape(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags),
                     Estimate(d->Width, d->Height, d->Depth, d->Format, d->NumChannels), array,
                     [&](CUarray* a) { return real(a, d); });
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
  Shape shape = PlainShape(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags);
  shape.levels = levels;
  return CreateArray(ip, shape, estimate, array, [&](CUmipmappedArray* a) { return real(a, d, levels); });
}

STOKER_HOOK CUresult CUDAAPI cuMipmappedArrayDestroy(CUmipmappedArray array) {
  STOKER_PROLOGUE(cuMipmappedArrayDestroy, PFN_cuMipmappedArrayDestroy_v5000)
  return DestroyArray(ip, array, [&] { return real(array); });
}
