// The device loader through a recording fake runtime (its "GPU" runs the
// CPU twin): batches copied on the copy stream, the consumer's stream
// waiting on events, and the GPU-finishing layout (DeviceFinisher).
#include "stoker/device_loader.h"

#include <cstdio>

#include <gtest/gtest.h>

#include "device/device_loader_internal.h"
#include "device_loader_test_util.h"
#include "fake_runtime.h"
#include "pipeline/loader_test_util.h"

namespace stoker {
namespace {

TEST(DeviceLoader, DeliversTheHostLoadersBatchesThroughTheTransferEngine) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  testing::FakeDeviceRuntime fake;
  {
    auto reference = Loader::Create(dataset, SmallOptions());
    ASSERT_TRUE(reference.ok());
    Epoch expected = RunEpoch(**reference);

    DeviceLoaderOptions device_options;
    device_options.device_buffers = 2;
    auto loader = device::CreateDeviceLoader(dataset, SmallOptions(), fake, 0, device_options);
    ASSERT_TRUE(loader.ok()) << loader.error().ToString();
    auto consumer = reinterpret_cast<void*>(std::uintptr_t{77});
    Epoch got;
    std::optional<DeviceBatchView> held;
    while (true) {
      auto next = (*loader)->Next(consumer);
      ASSERT_TRUE(next.ok()) << next.error().ToString();
      if (!next->has_value()) break;
      const DeviceBatchView& b = **next;
      const auto bytes = static_cast<std::size_t>(b.shape[0] * b.shape[1] * b.shape[2] * b.shape[3]) * 4;
      got.indices.insert(got.indices.end(), b.indices.begin(), b.indices.end());
      got.labels.insert(got.labels.end(), b.labels.begin(), b.labels.end());
      auto* p = static_cast<const std::byte*>(b.images);
      got.pixels.insert(got.pixels.end(), p, p + bytes);
      // Hold each batch until the next arrives (as a training step would), then release it.
      if (held) {
        ASSERT_TRUE((*loader)->Release(*held, consumer).ok());
      }
      held = std::move(**next);
    }
    ASSERT_TRUE((*loader)->Release(*held, consumer).ok());
    EXPECT_EQ(got.indices, expected.indices);
    EXPECT_EQ(got.labels, expected.labels);
    EXPECT_EQ(got.pixels, expected.pixels);
    const auto stats = (*loader)->stats();
    EXPECT_EQ(stats.batches, 8u);
    EXPECT_GT(stats.copied_bytes, 0u);
    // The consumer's stream waited for each batch; the host never waited for
    // a copy it had just submitted.
    int waits = 0;
    for (const auto& line : fake.log) waits += line.starts_with("stream 77 waits for event");
    EXPECT_EQ(waits, 8);

    // Holding every device buffer is an error, not a hang.
    auto a = (*loader)->Next(consumer);
    auto b = (*loader)->Next(consumer);
    ASSERT_TRUE(a.ok() && b.ok());
    auto c = (*loader)->Next(consumer);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.error().code(), StatusCode::kResourceExhausted);
  }
  EXPECT_EQ(fake.live_device_allocations, 0);
  EXPECT_EQ(fake.live_events, 0);
  EXPECT_EQ(fake.live_streams, 0);
}

TEST(DeviceLoader, TypedFieldsAreRefusedNotDropped) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  testing::FakeDeviceRuntime fake;
  auto options = SmallOptions();
  FieldSpec label;
  label.name = "label";
  label.kind = FieldKind::kInt;
  label.keys = {"cls"};
  options.fields = {label};
  auto loader = device::CreateDeviceLoader(dataset, options, fake, 0, DeviceLoaderOptions{});
  ASSERT_FALSE(loader.ok());
  EXPECT_EQ(loader.error().code(), StatusCode::kUnimplemented);
  EXPECT_NE(loader.error().message().find("not carried to the GPU yet"), std::string::npos);
}

TEST(DeviceLoader, CudaWithoutAGpuIsUnavailableWithAReason) {
  if (QueryCuda().device_count > 0) GTEST_SKIP() << "this machine has a GPU";
  TempDir dir;
  auto d = DeviceLoader::Create(MakeDataset(dir), SmallOptions(), Device{DeviceKind::kCuda, 0});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code(), StatusCode::kUnavailable);
  EXPECT_NE(d.error().message().find("cannot use cuda:0"), std::string::npos) << d.error().message();
}

}  // namespace
}  // namespace stoker

namespace stoker {
namespace {

// Runs an epoch through a DeviceLoader over the fake runtime (whose "GPU"
// runs the CPU twin) and returns the float32 images.
Epoch RunDeviceEpoch(std::shared_ptr<const Dataset> dataset, LoaderOptions options, DeviceLoaderOptions device_options,
                     testing::FakeDeviceRuntime& fake, std::uint64_t* fallbacks = nullptr) {
  device_options.device_buffers = 2;
  auto loader = device::CreateDeviceLoader(std::move(dataset), options, fake, 0, device_options);
  EXPECT_TRUE(loader.ok()) << loader.error().ToString();
  if (!loader.ok()) return {};
  Epoch e = DrainDeviceEpoch(**loader);
  if (fallbacks != nullptr) *fallbacks = (*loader)->stats().device_fallbacks;
  return e;
}

// Largest and mean difference in uint8 levels between two float32 epochs
// normalised with the same mean/std.
std::pair<double, double> LevelDifference(const Epoch& a, const Epoch& b, const TransformOptions& t, int pixels) {
  const auto* x = reinterpret_cast<const float*>(a.pixels.data());
  const auto* y = reinterpret_cast<const float*>(b.pixels.data());
  const std::size_t n = a.pixels.size() / 4;
  double worst = 0, sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const int c = static_cast<int>((i / static_cast<std::size_t>(pixels)) % 3);
    const double d = std::abs(static_cast<double>(x[i]) - y[i]) * t.std[c] * 255;
    worst = std::max(worst, d);
    sum += d;
  }
  return {worst, sum / static_cast<double>(n)};
}

TEST(DeviceLoader, FinishingOnTheGpuMatchesTheCpuPath) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  auto options = SmallOptions();
  options.transform.normalize = true;
  options.transform.mean = {0.485f, 0.456f, 0.406f};
  options.transform.std = {0.229f, 0.224f, 0.225f};
  auto cpu = Loader::Create(dataset, options);
  ASSERT_TRUE(cpu.ok());
  Epoch on_cpu = RunEpoch(**cpu);

  DeviceLoaderOptions on_gpu;
  on_gpu.finish_on_device = true;
  testing::FakeDeviceRuntime fake;
  std::uint64_t fallbacks = 99;
  Epoch finished = RunDeviceEpoch(dataset, options, on_gpu, fake, &fallbacks);
  EXPECT_EQ(fallbacks, 0u);  // three output-sized images of room per sample is plenty for these
  ASSERT_EQ(finished.indices, on_cpu.indices);
  ASSERT_EQ(finished.pixels.size(), on_cpu.pixels.size());
  // The GPU's resize is a float triangle filter, the CPU's Pillow's fixed-point one.
  auto [worst, mean] = LevelDifference(finished, on_cpu, options.transform, 32 * 32);
  std::printf("GPU-finished vs CPU path: max %.2f, mean %.3f levels\n", worst, mean);
  EXPECT_LT(mean, 0.5) << "worst " << worst;
  EXPECT_LE(worst, 2.0) << "mean " << mean;
  int kernels = 0;
  for (const auto& line : fake.log) kernels += line.starts_with("preprocess ");
  EXPECT_EQ(kernels, 8);  // one per batch, on the copy stream

  // With no room for decoded crops every image takes the fallback (resized on
  // the CPU, finished on the GPU): the same result within the same bound.
  on_gpu.device_input_factor = 0;
  testing::FakeDeviceRuntime fake2;
  Epoch fallback = RunDeviceEpoch(dataset, options, on_gpu, fake2, &fallbacks);
  EXPECT_GE(fallbacks, 30u);  // every sample of the epoch (and of batches prepared ahead)
  auto [worst2, mean2] = LevelDifference(fallback, on_cpu, options.transform, 32 * 32);
  std::printf("fallback vs CPU path: max %.3f, mean %.4f levels\n", worst2, mean2);
  EXPECT_LT(mean2, 0.6) << "worst " << worst2;
  EXPECT_LE(worst2, 1.0) << "the fallback resizes exactly as the CPU path; only float rounding differs";
}

}  // namespace
}  // namespace stoker
