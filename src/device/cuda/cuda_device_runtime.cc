// DeviceRuntime over the CUDA runtime, linked statically (cudart_static), so
// that the library loads where no CUDA libraries are installed: without a
// driver, cudaGetDeviceCount fails and CudaDeviceRuntime() says why.
#include <cuda_runtime_api.h>

#include <fmt/format.h>

#include "core/cuda_runtime.h"
#include "device/cuda/preprocess_kernel.h"
#include "device/runtime.h"

namespace stoker::device {
namespace {

Status Check(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return Status::Ok();
  const StatusCode code = err == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted : StatusCode::kInternal;
  return Status(code, fmt::format("{}: {} ({})", what, cudaGetErrorString(err), cudaGetErrorName(err)));
}

class CudaRuntimeImpl final : public DeviceRuntime {
 public:
  explicit CudaRuntimeImpl(int count) : count_(count) {}
  std::string name() const override { return "cuda"; }
  int device_count() const override { return count_; }
  Result<int> CurrentDevice() override {
    int device = 0;
    STOKER_RETURN_IF_ERROR(Check(cudaGetDevice(&device), "cudaGetDevice"));
    return device;
  }
  Status SetDevice(int device) override {
    return Check(cudaSetDevice(device), fmt::format("cudaSetDevice({})", device));
  }

  Result<void*> DeviceAlloc(std::size_t bytes) override {
    void* p = nullptr;
    STOKER_RETURN_IF_ERROR(Check(cudaMalloc(&p, bytes), fmt::format("cudaMalloc({} bytes)", bytes)));
    return p;
  }
  void DeviceFree(void* p) override { (void)cudaFree(p); }
  Result<void*> PinnedAlloc(std::size_t bytes) override {
    void* p = nullptr;
    STOKER_RETURN_IF_ERROR(
        Check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), fmt::format("cudaHostAlloc({} bytes)", bytes)));
    return p;
  }
  void PinnedFree(void* p) override { (void)cudaFreeHost(p); }

  Result<StreamHandle> CreateStream() override {
    cudaStream_t s = nullptr;
    // Non-blocking: no implicit ordering with the legacy default stream.
    STOKER_RETURN_IF_ERROR(Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"));
    return static_cast<StreamHandle>(s);
  }
  void DestroyStream(StreamHandle s) override { (void)cudaStreamDestroy(static_cast<cudaStream_t>(s)); }
  Result<EventHandle> CreateEvent(bool timing) override {
    cudaEvent_t e = nullptr;
    STOKER_RETURN_IF_ERROR(
        Check(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming), "cudaEventCreate"));
    return static_cast<EventHandle>(e);
  }
  void DestroyEvent(EventHandle e) override { (void)cudaEventDestroy(static_cast<cudaEvent_t>(e)); }

  Status CopyToDeviceAsync(void* dst, const void* src, std::size_t bytes, StreamHandle s) override {
    return Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(s)),
                 "cudaMemcpyAsync (host to device)");
  }
  Status CopyToHostAsync(void* dst, const void* src, std::size_t bytes, StreamHandle s) override {
    return Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(s)),
                 "cudaMemcpyAsync (device to host)");
  }
  Status SynchronizeStream(StreamHandle s) override {
    return Check(cudaStreamSynchronize(static_cast<cudaStream_t>(s)), "cudaStreamSynchronize");
  }
  Status RecordEvent(EventHandle e, StreamHandle s) override {
    return Check(cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(s)), "cudaEventRecord");
  }
  Status StreamWaitEvent(StreamHandle s, EventHandle e) override {
    return Check(cudaStreamWaitEvent(static_cast<cudaStream_t>(s), static_cast<cudaEvent_t>(e), 0),
                 "cudaStreamWaitEvent");
  }
  Status SynchronizeEvent(EventHandle e) override {
    return Check(cudaEventSynchronize(static_cast<cudaEvent_t>(e)), "cudaEventSynchronize");
  }
  Result<float> ElapsedMilliseconds(EventHandle a, EventHandle b) override {
    float ms = 0;
    STOKER_RETURN_IF_ERROR(Check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(a), static_cast<cudaEvent_t>(b)),
                                 "cudaEventElapsedTime"));
    return ms;
  }
  Status LaunchPreprocess(const std::uint8_t* pixels, const std::uint8_t* decoded, const ImageDesc* images,
                          std::int32_t count, const OutputDesc& output, void* out, StreamHandle s) override {
    return Check(static_cast<cudaError_t>(
                     LaunchPreprocessKernel(pixels, decoded, images, count, output, out, OutputImageBytes(output), s)),
                 "preprocessing kernel launch");
  }
  Status LaunchAugment(const std::uint8_t* pixels, const std::uint8_t* decoded, const ImageDesc* images,
                       const AugmentDesc* augments, std::int32_t count, const OutputDesc& output, std::uint8_t* staging,
                       void* out, StreamHandle s) override {
    return Check(static_cast<cudaError_t>(LaunchAugmentKernels(pixels, decoded, images, augments, count, output,
                                                               staging, out, OutputImageBytes(output), s)),
                 "augmentation kernel launch");
  }

 private:
  int count_;
};

}  // namespace

DeviceRuntime* CudaDeviceRuntime(std::string* why) {
  static const std::pair<DeviceRuntime*, std::string> probed = []() -> std::pair<DeviceRuntime*, std::string> {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) return {nullptr, NoUsableCudaDevice(cudaGetErrorString(err))};
    if (count == 0) return {nullptr, "no CUDA device"};
    return {new CudaRuntimeImpl(count), ""};  // lives until exit
  }();
  if (why != nullptr) *why = probed.second;
  return probed.first;
}

}  // namespace stoker::device
