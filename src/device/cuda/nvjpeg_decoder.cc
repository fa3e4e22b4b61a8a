// DeviceJpegDecoder over nvJPEG, loaded at run time with dlopen so that
// stoker neither links nor ships it: the library comes from the CUDA
// toolkit, the nvidia-nvjpeg wheel, or $STOKER_NVJPEG_LIBRARY. Two
// handles: the hardware decoder (A100/H100/H200 JPEG engines) when the GPU
// has one, and the default (hybrid CPU/GPU) decoder for the rest.
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include <fmt/format.h>
#include <nvjpeg.h>

#include "device/jpeg_decoder.h"

namespace stoker::device {
namespace {

const char* StatusName(nvjpegStatus_t s) {
  switch (s) {
    case NVJPEG_STATUS_SUCCESS:
      return "success";
    case NVJPEG_STATUS_NOT_INITIALIZED:
      return "not initialised";
    case NVJPEG_STATUS_INVALID_PARAMETER:
      return "invalid parameter";
    case NVJPEG_STATUS_BAD_JPEG:
      return "bad JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED:
      return "JPEG not supported";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE:
      return "allocator failure";
    case NVJPEG_STATUS_EXECUTION_FAILED:
      return "execution failed";
    case NVJPEG_STATUS_ARCH_MISMATCH:
      return "not supported on this GPU";
    case NVJPEG_STATUS_INTERNAL_ERROR:
      return "internal error";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED:
      return "implementation not supported";
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM:
      return "incomplete bitstream";
  }
  return "unknown status";
}

// The entry points stoker uses, typed from nvjpeg.h.
struct NvjpegApi {
  void* library = nullptr;
  decltype(&nvjpegGetProperty) GetProperty = nullptr;
  decltype(&nvjpegCreateEx) CreateEx = nullptr;
  decltype(&nvjpegDestroy) Destroy = nullptr;
  decltype(&nvjpegJpegStateCreate) JpegStateCreate = nullptr;
  decltype(&nvjpegJpegStateDestroy) JpegStateDestroy = nullptr;
  decltype(&nvjpegGetHardwareDecoderInfo) GetHardwareDecoderInfo = nullptr;
  decltype(&nvjpegDecodeBatchedInitialize) DecodeBatchedInitialize = nullptr;
  decltype(&nvjpegDecodeBatched) DecodeBatched = nullptr;
  decltype(&nvjpegDecode) Decode = nullptr;
};

template <typename F>
bool Bind(void* library, const char* name, F& f, std::string* missing) {
  f = reinterpret_cast<F>(dlsym(library, name));
  if (f == nullptr && missing->empty()) *missing = name;
  return f != nullptr;
}

// Opens the library once per process; nullptr and `why` when it is absent.
const NvjpegApi* LoadNvjpeg(std::string* why) {
  static std::once_flag once;
  static NvjpegApi api;
  static std::string error;
  std::call_once(once, [] {
    std::vector<std::string> names;
    if (const char* env = std::getenv("STOKER_NVJPEG_LIBRARY"); env != nullptr && *env != '\0') {
      names.push_back(env);
    } else {
      names = {"libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so"};
    }
    std::string tried;
    for (const auto& name : names) {
      api.library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (api.library != nullptr) break;
      const char* e = dlerror();
      tried += fmt::format("{}{}", tried.empty() ? "" : "; ", e != nullptr ? e : name);
    }
    if (api.library == nullptr) {
      error = fmt::format(
          "nvJPEG is not installed ({}); install the CUDA toolkit's nvJPEG or the nvidia-nvjpeg wheel, or set "
          "STOKER_NVJPEG_LIBRARY to libnvjpeg.so's path",
          tried);
      return;
    }
    std::string missing;
    Bind(api.library, "nvjpegGetProperty", api.GetProperty, &missing);
    Bind(api.library, "nvjpegCreateEx", api.CreateEx, &missing);
    Bind(api.library, "nvjpegDestroy", api.Destroy, &missing);
    Bind(api.library, "nvjpegJpegStateCreate", api.JpegStateCreate, &missing);
    Bind(api.library, "nvjpegJpegStateDestroy", api.JpegStateDestroy, &missing);
    Bind(api.library, "nvjpegGetHardwareDecoderInfo", api.GetHardwareDecoderInfo, &missing);
    Bind(api.library, "nvjpegDecodeBatchedInitialize", api.DecodeBatchedInitialize, &missing);
    Bind(api.library, "nvjpegDecodeBatched", api.DecodeBatched, &missing);
    Bind(api.library, "nvjpegDecode", api.Decode, &missing);
    if (!missing.empty()) {
      error = fmt::format("the nvJPEG library found lacks {} (too old?)", missing);
      dlclose(api.library);
      api.library = nullptr;
    }
  });
  if (api.library == nullptr) {
    if (why != nullptr) *why = error;
    return nullptr;
  }
  return &api;
}

// A handle with its batched-decode state and its single-image state.
struct Backend {
  nvjpegHandle_t handle = nullptr;
  nvjpegJpegState_t batch_state = nullptr;
  nvjpegJpegState_t one_state = nullptr;
  int batch_size = 0;  // what batch_state was initialised for
};

class NvjpegDecoder final : public DeviceJpegDecoder {
 public:
  NvjpegDecoder(const NvjpegApi& api, std::string version) : api_(api), version_(std::move(version)) {}
  ~NvjpegDecoder() override {
    for (Backend* b : {&hardware_, &gpu_}) {
      if (b->batch_state != nullptr) api_.JpegStateDestroy(b->batch_state);
      if (b->one_state != nullptr) api_.JpegStateDestroy(b->one_state);
      if (b->handle != nullptr) api_.Destroy(b->handle);
    }
  }

  // Creates the backends; `why` says what failed.
  Status Open() {
    // The hardware decoder exists on A100, H100, H200 (and a few others);
    // elsewhere creating it fails, which is how its absence is learnt.
    if (api_.CreateEx(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, 0, &hardware_.handle) == NVJPEG_STATUS_SUCCESS) {
      unsigned engines = 0, cores = 0;
      if (api_.GetHardwareDecoderInfo(hardware_.handle, &engines, &cores) == NVJPEG_STATUS_SUCCESS) engines_ = engines;
      if (!MakeStates(hardware_).ok()) {
        api_.Destroy(hardware_.handle);
        hardware_ = {};
      }
    } else {
      hardware_.handle = nullptr;
    }
    const nvjpegStatus_t s = api_.CreateEx(NVJPEG_BACKEND_DEFAULT, nullptr, nullptr, 0, &gpu_.handle);
    if (s != NVJPEG_STATUS_SUCCESS) {
      gpu_.handle = nullptr;
      return Status::Unavailable(fmt::format("nvjpegCreateEx: {} (is a CUDA driver and GPU present?)", StatusName(s)));
    }
    return MakeStates(gpu_);
  }

  std::string name() const override {
    if (hardware_.handle != nullptr)
      return fmt::format("nvJPEG {}, hardware decoder ({} engine{}) + GPU decoder", version_, engines_,
                         engines_ == 1 ? "" : "s");
    return fmt::format("nvJPEG {}, GPU decoder (this GPU has no hardware JPEG decoder)", version_);
  }
  codec::GpuDecodeCaps caps() const override {
    codec::GpuDecodeCaps c;
    c.hardware = hardware_.handle != nullptr;
    return c;
  }

  Status DecodeBatch(std::span<const DeviceJpegJob> jobs, StreamHandle stream) override {
    std::vector<const DeviceJpegJob*> on_hardware, on_gpu;
    for (const auto& job : jobs) (job.hardware && hardware_.handle != nullptr ? on_hardware : on_gpu).push_back(&job);
    STOKER_RETURN_IF_ERROR(Batched(hardware_, on_hardware, stream));
    return Batched(gpu_, on_gpu, stream);
  }

  Status DecodeOne(const DeviceJpegJob& job, StreamHandle stream) override {
    nvjpegImage_t image = Destination(job);
    const nvjpegStatus_t s =
        api_.Decode(gpu_.handle, gpu_.one_state, reinterpret_cast<const unsigned char*>(job.jpeg.data()),
                    job.jpeg.size(), NVJPEG_OUTPUT_RGBI, &image, static_cast<cudaStream_t>(stream));
    if (s == NVJPEG_STATUS_SUCCESS) return Status::Ok();
    return Status(
        s == NVJPEG_STATUS_BAD_JPEG || s == NVJPEG_STATUS_JPEG_NOT_SUPPORTED || s == NVJPEG_STATUS_INCOMPLETE_BITSTREAM
            ? StatusCode::kCorruption
            : StatusCode::kInternal,
        fmt::format("nvjpegDecode: {}", StatusName(s)));
  }

 private:
  Status MakeStates(Backend& b) {
    if (api_.JpegStateCreate(b.handle, &b.batch_state) != NVJPEG_STATUS_SUCCESS ||
        api_.JpegStateCreate(b.handle, &b.one_state) != NVJPEG_STATUS_SUCCESS)
      return Status::Unavailable("nvjpegJpegStateCreate failed");
    return Status::Ok();
  }

  static nvjpegImage_t Destination(const DeviceJpegJob& job) {
    nvjpegImage_t image{};
    image.channel[0] = job.out;
    image.pitch[0] = static_cast<std::size_t>(job.width) * 3;
    return image;
  }

  Status Batched(Backend& b, const std::vector<const DeviceJpegJob*>& jobs, StreamHandle stream) {
    if (jobs.empty()) return Status::Ok();
    const int n = static_cast<int>(jobs.size());
    if (b.batch_size != n) {
      const nvjpegStatus_t s = api_.DecodeBatchedInitialize(b.handle, b.batch_state, n, 1, NVJPEG_OUTPUT_RGBI);
      if (s != NVJPEG_STATUS_SUCCESS)
        return Status::Internal(fmt::format("nvjpegDecodeBatchedInitialize({}): {}", n, StatusName(s)));
      b.batch_size = n;
    }
    data_.clear();
    lengths_.clear();
    images_.clear();
    for (const DeviceJpegJob* job : jobs) {
      data_.push_back(reinterpret_cast<const unsigned char*>(job->jpeg.data()));
      lengths_.push_back(job->jpeg.size());
      images_.push_back(Destination(*job));
    }
    const nvjpegStatus_t s = api_.DecodeBatched(b.handle, b.batch_state, data_.data(), lengths_.data(), images_.data(),
                                                static_cast<cudaStream_t>(stream));
    if (s == NVJPEG_STATUS_SUCCESS) return Status::Ok();
    b.batch_size = 0;  // a failed batch must be initialised again
    return Status(StatusCode::kCorruption, fmt::format("nvjpegDecodeBatched ({} images, {} decoder): {}", n,
                                                       &b == &hardware_ ? "hardware" : "GPU", StatusName(s)));
  }

  const NvjpegApi& api_;
  std::string version_;
  unsigned engines_ = 0;
  Backend hardware_, gpu_;
  std::vector<const unsigned char*> data_;
  std::vector<std::size_t> lengths_;
  std::vector<nvjpegImage_t> images_;
};

}  // namespace

std::unique_ptr<DeviceJpegDecoder> OpenNvjpegDecoder(std::string* why) {
  const NvjpegApi* api = LoadNvjpeg(why);
  if (api == nullptr) return nullptr;
  int major = 0, minor = 0;
  (void)api->GetProperty(MAJOR_VERSION, &major);
  (void)api->GetProperty(MINOR_VERSION, &minor);
  auto decoder = std::make_unique<NvjpegDecoder>(*api, fmt::format("{}.{}", major, minor));
  if (Status s = decoder->Open(); !s.ok()) {
    if (why != nullptr) *why = s.message();
    return nullptr;
  }
  return decoder;
}

}  // namespace stoker::device
