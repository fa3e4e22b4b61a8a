// The share probe's view of the driver: one function table, filled by one
// of the three ways programs reach the driver (direct calls to exported
// names, dlsym on the driver's library, cuGetProcAddress), so that every
// scenario runs the same way through each.
#pragma once

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <cudaTypedefs.h>

#include <string>

namespace probe {

// X(field, exported symbol, api, version, per-thread)
#define PROBE_DRIVER_FUNCTIONS(X)                                                         \
  X(Init, cuInit, cuInit, 2000, 0)                                                        \
  X(DeviceGet, cuDeviceGet, cuDeviceGet, 2000, 0)                                         \
  X(DeviceGetCount, cuDeviceGetCount, cuDeviceGetCount, 2000, 0)                          \
  X(DeviceGetUuid, cuDeviceGetUuid, cuDeviceGetUuid, 9020, 0)                             \
  X(DeviceTotalMem, cuDeviceTotalMem_v2, cuDeviceTotalMem, 3020, 0)                       \
  X(CtxCreate, cuCtxCreate_v2, cuCtxCreate, 3020, 0)                                      \
  X(CtxDestroy, cuCtxDestroy_v2, cuCtxDestroy, 4000, 0)                                   \
  X(CtxSetCurrent, cuCtxSetCurrent, cuCtxSetCurrent, 4000, 0)                             \
  X(CtxSynchronize, cuCtxSynchronize, cuCtxSynchronize, 2000, 0)                          \
  X(PrimaryRetain, cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000, 0)           \
  X(PrimaryRelease, cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease, 11000, 0)    \
  X(PrimaryReset, cuDevicePrimaryCtxReset_v2, cuDevicePrimaryCtxReset, 11000, 0)          \
  X(MemGetInfo, cuMemGetInfo_v2, cuMemGetInfo, 3020, 0)                                   \
  X(MemAlloc, cuMemAlloc_v2, cuMemAlloc, 3020, 0)                                         \
  X(MemAllocPitch, cuMemAllocPitch_v2, cuMemAllocPitch, 3020, 0)                          \
  X(MemAllocManaged, cuMemAllocManaged, cuMemAllocManaged, 6000, 0)                       \
  X(MemFree, cuMemFree_v2, cuMemFree, 3020, 0)                                            \
  X(MemAllocHost, cuMemAllocHost_v2, cuMemAllocHost, 3020, 0)                             \
  X(MemFreeHost, cuMemFreeHost, cuMemFreeHost, 2000, 0)                                   \
  X(MemAllocAsync, cuMemAllocAsync, cuMemAllocAsync, 11020, 0)                            \
  X(MemAllocFromPoolAsync, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020, 0)    \
  X(MemFreeAsync, cuMemFreeAsync, cuMemFreeAsync, 11020, 0)                               \
  X(PoolCreate, cuMemPoolCreate, cuMemPoolCreate, 11020, 0)                               \
  X(PoolDestroy, cuMemPoolDestroy, cuMemPoolDestroy, 11020, 0)                            \
  X(PoolTrimTo, cuMemPoolTrimTo, cuMemPoolTrimTo, 11020, 0)                               \
  X(PoolSetAttribute, cuMemPoolSetAttribute, cuMemPoolSetAttribute, 11020, 0)             \
  X(MemCreate, cuMemCreate, cuMemCreate, 10020, 0)                                        \
  X(MemRelease, cuMemRelease, cuMemRelease, 10020, 0)                                     \
  X(AddressReserve, cuMemAddressReserve, cuMemAddressReserve, 10020, 0)                   \
  X(MemMap, cuMemMap, cuMemMap, 10020, 0)                                                 \
  X(MemUnmap, cuMemUnmap, cuMemUnmap, 10020, 0)                                           \
  X(MemRetain, cuMemRetainAllocationHandle, cuMemRetainAllocationHandle, 11000, 0)        \
  X(MemExport, cuMemExportToShareableHandle, cuMemExportToShareableHandle, 10020, 0)      \
  X(MemImport, cuMemImportFromShareableHandle, cuMemImportFromShareableHandle, 10020, 0)  \
  X(ArrayCreate, cuArrayCreate_v2, cuArrayCreate, 3020, 0)                                \
  X(Array3DCreate, cuArray3DCreate_v2, cuArray3DCreate, 3020, 0)                          \
  X(ArrayDestroy, cuArrayDestroy, cuArrayDestroy, 2000, 0)                                \
  X(MipmappedCreate, cuMipmappedArrayCreate, cuMipmappedArrayCreate, 5000, 0)             \
  X(MipmappedDestroy, cuMipmappedArrayDestroy, cuMipmappedArrayDestroy, 5000, 0)          \
  X(MemMapArrayAsync, cuMemMapArrayAsync, cuMemMapArrayAsync, 11010, 0)                   \
  X(ModuleLoadData, cuModuleLoadData, cuModuleLoadData, 2000, 0)                          \
  X(ModuleUnload, cuModuleUnload, cuModuleUnload, 2000, 0)                                \
  X(ModuleGetFunction, cuModuleGetFunction, cuModuleGetFunction, 2000, 0)                 \
  X(LibraryLoadData, cuLibraryLoadData, cuLibraryLoadData, 12000, 0)                      \
  X(LibraryUnload, cuLibraryUnload, cuLibraryUnload, 12000, 0)                            \
  X(GraphCreate, cuGraphCreate, cuGraphCreate, 10000, 0)                                  \
  X(GraphDestroy, cuGraphDestroy, cuGraphDestroy, 10000, 0)                               \
  X(GraphAddMemAllocNode, cuGraphAddMemAllocNode, cuGraphAddMemAllocNode, 11040, 0)       \
  X(GraphInstantiate, cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, 11040, 0) \
  X(GraphLaunch, cuGraphLaunch, cuGraphLaunch, 10000, 0)                                  \
  X(GraphExecDestroy, cuGraphExecDestroy, cuGraphExecDestroy, 10000, 0)                   \
  X(GraphMemTrim, cuDeviceGraphMemTrim, cuDeviceGraphMemTrim, 11040, 0)                   \
  X(LaunchKernel, cuLaunchKernel, cuLaunchKernel, 4000, 0)                                \
  X(LaunchKernelPtsz, cuLaunchKernel_ptsz, cuLaunchKernel, 7000, 1)                       \
  X(StreamCreate, cuStreamCreate, cuStreamCreate, 2000, 0)                                \
  X(StreamSynchronize, cuStreamSynchronize, cuStreamSynchronize, 2000, 0)

struct Driver {
#define PROBE_FIELD(field, symbol, api, version, pt) decltype(&::symbol) field = nullptr;
  PROBE_DRIVER_FUNCTIONS(PROBE_FIELD)
#undef PROBE_FIELD
};

enum class Path { kDirect, kDlsym, kProcAddress };

// Fills `d` through `path`. With cuGetProcAddress, each entry is asked for
// at its own version, and left empty when that is above `version` (a
// program built for an older CUDA; 0: no limit). False with `*error` when
// the path itself fails.
bool LoadDriver(Path path, int version, Driver* d, std::string* error);
bool ParsePath(const std::string& text, Path* path);

}  // namespace probe
