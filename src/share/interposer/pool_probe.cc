#include "share/interposer/pool_probe.h"

#include "share/interposer/cuda_api.h"
#include "share/interposer/real_driver.h"

namespace stoker::share {
namespace {

template <typename Fn>
Fn Symbol(const char* name) {
  return reinterpret_cast<Fn>(DriverSymbol(name));
}

// What the probe made, given back in reverse order whatever happens.
class ProbeResources {
 public:
  ProbeResources(PFN_cuMemPoolDestroy_v11020 destroy_pool, PFN_cuStreamDestroy_v4000 destroy_stream,
                 PFN_cuThreadExchangeStreamCaptureMode_v10010 exchange_mode)
      : destroy_pool_(destroy_pool), destroy_stream_(destroy_stream), exchange_mode_(exchange_mode) {}
  ProbeResources(const ProbeResources&) = delete;
  ProbeResources& operator=(const ProbeResources&) = delete;
  ~ProbeResources() {
    if (stream != nullptr) (void)destroy_stream_(stream);
    if (pool != nullptr) (void)destroy_pool_(pool);
    if (relaxed) (void)exchange_mode_(&mode);
  }

  CUmemoryPool pool = nullptr;
  CUstream stream = nullptr;
  bool relaxed = false;  // the thread's capture mode was exchanged (the old one is in `mode`)
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;

 private:
  PFN_cuMemPoolDestroy_v11020 destroy_pool_;
  PFN_cuStreamDestroy_v4000 destroy_stream_;
  PFN_cuThreadExchangeStreamCaptureMode_v10010 exchange_mode_;
};

}  // namespace

std::uint64_t MeasurePoolChunk(int ordinal) {
  const auto create_pool = Symbol<PFN_cuMemPoolCreate_v11020>("cuMemPoolCreate");
  const auto destroy_pool = Symbol<PFN_cuMemPoolDestroy_v11020>("cuMemPoolDestroy");
  const auto get = Symbol<PFN_cuMemPoolGetAttribute_v11020>("cuMemPoolGetAttribute");
  const auto allocate = Symbol<PFN_cuMemAllocFromPoolAsync_v11020>("cuMemAllocFromPoolAsync");
  const auto free_async = Symbol<PFN_cuMemFreeAsync_v11020>("cuMemFreeAsync");
  const auto create_stream = Symbol<PFN_cuStreamCreate_v2000>("cuStreamCreate");
  const auto synchronize = Symbol<PFN_cuStreamSynchronize_v2000>("cuStreamSynchronize");
  const auto destroy_stream = Symbol<PFN_cuStreamDestroy_v4000>("cuStreamDestroy_v2");
  const auto exchange_mode = Symbol<PFN_cuThreadExchangeStreamCaptureMode_v10010>("cuThreadExchangeStreamCaptureMode");
  if (!create_pool || !destroy_pool || !get || !allocate || !free_async || !create_stream || !synchronize ||
      !destroy_stream || !exchange_mode)
    return 0;
  ProbeResources made(destroy_pool, destroy_stream, exchange_mode);
  // A capture in global mode on this thread would be invalidated by the
  // probe's calls; in relaxed mode they are allowed and not captured.
  if (exchange_mode(&made.mode) != CUDA_SUCCESS) return 0;
  made.relaxed = true;
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = ordinal;
  if (create_pool(&made.pool, &props) != CUDA_SUCCESS) {
    made.pool = nullptr;
    return 0;
  }
  if (create_stream(&made.stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
    made.stream = nullptr;
    return 0;
  }
  CUdeviceptr byte = 0;
  if (allocate(&byte, 1, made.pool, made.stream) != CUDA_SUCCESS) return 0;
  cuuint64_t reserved = 0;
  const bool read = get(made.pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) == CUDA_SUCCESS;
  // Back before the caller admits its own allocation (a pool destroyed with
  // memory out releases it once that is freed: no leak either way).
  if (free_async(byte, made.stream) != CUDA_SUCCESS || synchronize(made.stream) != CUDA_SUCCESS) return 0;
  return read ? reserved : 0;
}

}  // namespace stoker::share
