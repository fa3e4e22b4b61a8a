// A fake nvJPEG for the GPU decode tests: it decodes each job on the host
// (libjpeg) into the fake runtime's "device" memory, logs its batches, and
// refuses what a test tells it to; with the loader runs the tests compare.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <turbojpeg.h>

#include "codec/jpeg.h"
#include "device/device_loader_internal.h"
#include "device/jpeg_decoder.h"
#include "device_loader_test_util.h"
#include "fake_runtime.h"
#include "pipeline/loader_test_util.h"
#include "stoker/device_loader.h"

namespace stoker {

// What the fake decoder saw and what it is told to refuse.
struct FakeDecoderState {
  bool hardware = true;
  bool refuse_batches = false;                 // every DecodeBatch fails
  std::set<std::size_t> refuse_alone;          // JPEG sizes DecodeOne refuses too
  testing::FakeDeviceRuntime* fake = nullptr;  // whose log the decodes go into
  std::atomic<int> batches{0};                 // DecodeBatch calls (polled while a staging thread decodes)
  int ones = 0, hardware_jobs = 0;
  std::uint64_t jpeg_bytes = 0, decoded_pixels = 0;  // over every job decoded
  std::mutex threads_mu;
  std::set<std::thread::id> threads;  // where DecodeBatch ran
};

class FakeJpegDecoder final : public device::DeviceJpegDecoder {
 public:
  explicit FakeJpegDecoder(std::shared_ptr<FakeDecoderState> state) : state_(std::move(state)) {}
  std::string name() const override { return "fake nvJPEG"; }
  codec::GpuDecodeCaps caps() const override { return {.hardware = state_->hardware}; }
  Status DecodeBatch(std::span<const device::DeviceJpegJob> jobs, device::StreamHandle stream) override {
    ++state_->batches;
    {
      std::lock_guard<std::mutex> lock(state_->threads_mu);
      state_->threads.insert(std::this_thread::get_id());
    }
    if (state_->refuse_batches) return Status::Corruption("fake: the batch holds an image the decoder refuses");
    state_->fake->Log(
        fmt::format("jpeg decode {} images on stream {}", jobs.size(), testing::FakeDeviceRuntime::Id(stream)));
    for (const auto& job : jobs) {
      state_->hardware_jobs += job.hardware;
      STOKER_RETURN_IF_ERROR(DecodeInto(job));
    }
    return Status::Ok();
  }
  Status DecodeOne(const device::DeviceJpegJob& job, device::StreamHandle) override {
    ++state_->ones;
    if (state_->refuse_alone.contains(job.jpeg.size())) return Status::Corruption("fake: refused");
    return DecodeInto(job);
  }

 private:
  Status DecodeInto(const device::DeviceJpegJob& job) {
    state_->jpeg_bytes += job.jpeg.size();
    state_->decoded_pixels += static_cast<std::uint64_t>(job.width) * job.height;
    codec::DecodedRegion d;
    STOKER_RETURN_IF_ERROR(codec::DecodeJpeg(job.jpeg, codec::Roi{}, 1, d));
    if (d.width != job.width || d.height != job.height) return Status::Internal("fake: size differs from the job");
    std::memcpy(job.out, d.pixels.data(), d.pixels.size());
    return Status::Ok();
  }
  std::shared_ptr<FakeDecoderState> state_;
};

inline device::OpenJpegDecoder Opens(std::shared_ptr<FakeDecoderState> state) {
  return [state](std::string*) { return std::make_unique<FakeJpegDecoder>(state); };
}

inline std::string Encode(int w, int h, unsigned seed, int pixel_format, int sampling, int flags) {
  const int channels = pixel_format == TJPF_CMYK ? 4 : 3;
  std::vector<unsigned char> px(static_cast<std::size_t>(w) * h * channels);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < channels; ++c)
        px[(static_cast<std::size_t>(y) * w + x) * channels + c] =
            static_cast<unsigned char>((x * (c + 1) + y * (3 - c % 3) + seed * 40) & 0xff);
  tjhandle tj = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(tj, px.data(), w, 0, h, pixel_format, &out, &size, sampling, 90, flags), 0)
      << tjGetErrorStr2(tj);
  std::string jpeg(reinterpret_cast<char*>(out), size);
  tjFree(out);
  tjDestroy(tj);
  return jpeg;
}

struct LoaderRun {
  Epoch epoch;
  DeviceLoaderStats stats;
};

inline LoaderRun RunGpuDecode(std::shared_ptr<const Dataset> dataset, const LoaderOptions& options,
                              DeviceLoaderOptions device, testing::FakeDeviceRuntime& fake,
                              const device::OpenJpegDecoder& open) {
  LoaderRun r;
  device.device_buffers = 2;
  auto loader = device::CreateDeviceLoader(std::move(dataset), options, fake, 0, device, open);
  EXPECT_TRUE(loader.ok()) << loader.error().ToString();
  if (!loader.ok()) return r;
  r.epoch = DrainDeviceEpoch(**loader);
  r.stats = (*loader)->stats();
  return r;
}

inline LoaderOptions ExactOptions() {
  LoaderOptions o = SmallOptions();
  // Without DCT scaling the CPU decodes the box's region at full size, so
  // both paths resample the same pixels: only float rounding may differ.
  o.transform.dct_scaling = false;
  return o;
}

inline DeviceLoaderOptions GpuDecode() {
  DeviceLoaderOptions d;
  d.finish_on_device = true;
  d.decode_on_device = true;
  return d;
}

inline Epoch CpuDecodeEpoch(std::shared_ptr<const Dataset> dataset, const LoaderOptions& options) {
  DeviceLoaderOptions d;
  d.finish_on_device = true;
  testing::FakeDeviceRuntime fake;
  return RunGpuDecode(std::move(dataset), options, d, fake, Opens(std::make_shared<FakeDecoderState>())).epoch;
}

}  // namespace stoker
