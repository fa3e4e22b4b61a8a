// Tests that need a GPU (built with CUDA; skipped where no device is
// usable): the kernel against its CPU twin, copies overlapping compute as
// CUDA events show, no device memory leaked after many epochs, and nvJPEG's
// decode against the CPU's.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "device/augment_plan.h"
#include "device/device_loader_internal.h"
#include "device/jpeg_decoder.h"
#include "device/preprocess_cpu.h"
#include "device/runtime.h"
#include "device/transfer_engine.h"
#include "pipeline/loader_test_util.h"
#include "transform/warp.h"

int LaunchSpin(std::int64_t cycles, int* device_sink, void* stream);

namespace stoker {
namespace {

using device::ImageDesc;
using device::OutputDesc;
using device::OutputType;

device::DeviceRuntime* Gpu() {
  std::string why;
  device::DeviceRuntime* runtime = device::CudaDeviceRuntime(&why);
  if (runtime == nullptr) std::printf("no GPU: %s\n", why.c_str());
  return runtime;
}

#define REQUIRE_GPU()                           \
  device::DeviceRuntime* gpu = Gpu();           \
  if (gpu == nullptr) GTEST_SKIP() << "no GPU"; \
  ASSERT_TRUE(gpu->SetDevice(0).ok())

// Decoded-image batches: random sizes, boxes (fractional, partly outside
// nothing), flips; pixels random.
struct HostBatch {
  std::vector<ImageDesc> images;
  std::vector<std::uint8_t> pixels;
};

HostBatch RandomBatch(int count, unsigned seed) {
  std::mt19937 rng(seed);
  HostBatch b;
  for (int k = 0; k < count; ++k) {
    ImageDesc d;
    d.width = 40 + static_cast<int>(rng() % 400);
    d.height = 40 + static_cast<int>(rng() % 300);
    d.offset = b.pixels.size();
    const float bw = static_cast<float>(d.width) * (0.2f + 0.8f * static_cast<float>(rng() % 1000) / 1000.0f);
    const float bh = static_cast<float>(d.height) * (0.2f + 0.8f * static_cast<float>(rng() % 1000) / 1000.0f);
    d.x0 = static_cast<float>(rng() % 1000) / 1000.0f * (static_cast<float>(d.width) - bw);
    d.y0 = static_cast<float>(rng() % 1000) / 1000.0f * (static_cast<float>(d.height) - bh);
    d.x1 = d.x0 + bw;
    d.y1 = d.y0 + bh;
    d.flip = static_cast<int>(rng() & 1);
    b.images.push_back(d);
    b.pixels.resize(b.pixels.size() + static_cast<std::size_t>(d.width) * d.height * 3);
  }
  for (auto& p : b.pixels) p = static_cast<std::uint8_t>(rng() & 0xff);
  return b;
}

float HalfToFloat(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    f = mant ? NAN : INFINITY;
  } else {
    f = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  }
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  u |= sign;
  std::memcpy(&f, &u, 4);
  return f;
}
float BFloat16ToFloat(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Gpu, KernelMatchesTheCpuTwinWithinOneLevel) {
  REQUIRE_GPU();
  HostBatch b = RandomBatch(24, 7);
  for (auto type : {OutputType::kFloat32, OutputType::kFloat16, OutputType::kBFloat16, OutputType::kUint8}) {
    for (int channels_last : {0, 1}) {
      OutputDesc o;
      o.width = 96;
      o.height = 80;
      o.type = type;
      o.channels_last = channels_last;
      o.normalize = type != OutputType::kUint8;
      const float mean[3] = {0.485f, 0.456f, 0.406f}, sd[3] = {0.229f, 0.224f, 0.225f};
      for (int c = 0; c < 3; ++c) o.mean[c] = mean[c], o.inv_std[c] = 1 / sd[c];
      const std::size_t image_bytes = device::OutputImageBytes(o), out_bytes = image_bytes * b.images.size();
      std::vector<std::byte> twin(out_bytes), from_gpu(out_bytes);
      device::PreprocessOnCpu(b.pixels.data(), b.images, o, twin.data());

      auto pixels = device::MakeDeviceMemory(*gpu, b.pixels.size());
      auto descs = device::MakeDeviceMemory(*gpu, b.images.size() * sizeof(ImageDesc));
      auto out = device::MakeDeviceMemory(*gpu, out_bytes);
      ASSERT_TRUE(pixels.ok() && descs.ok() && out.ok());
      auto stream = device::MakeStream(*gpu);
      ASSERT_TRUE(stream.ok());
      ASSERT_EQ(cudaMemcpy(pixels->get(), b.pixels.data(), b.pixels.size(), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(descs->get(), b.images.data(), b.images.size() * sizeof(ImageDesc), cudaMemcpyHostToDevice),
                cudaSuccess);
      ASSERT_TRUE(gpu->LaunchPreprocess(static_cast<const std::uint8_t*>(pixels->get()), nullptr,
                                        static_cast<const ImageDesc*>(descs->get()),
                                        static_cast<std::int32_t>(b.images.size()), o, out->get(), stream->get())
                      .ok());
      ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(stream->get())), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(from_gpu.data(), out->get(), out_bytes, cudaMemcpyDeviceToHost), cudaSuccess);

      // Compare in uint8 levels after de-normalising.
      double worst = 0;
      const std::size_t n = out_bytes / (type == OutputType::kUint8 ? 1 : type == OutputType::kFloat32 ? 4 : 2);
      const std::size_t per_image = n / b.images.size();
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t within = i % per_image;
        const int c = channels_last ? static_cast<int>(within % 3) : static_cast<int>(within / (per_image / 3));
        auto level = [&](const std::byte* base) -> double {
          switch (type) {
            case OutputType::kUint8:
              return static_cast<double>(reinterpret_cast<const std::uint8_t*>(base)[i]);
            case OutputType::kFloat32:
              return (reinterpret_cast<const float*>(base)[i] * sd[c] + mean[c]) * 255;
            case OutputType::kFloat16:
              return (HalfToFloat(reinterpret_cast<const std::uint16_t*>(base)[i]) * sd[c] + mean[c]) * 255;
            case OutputType::kBFloat16:
              return (BFloat16ToFloat(reinterpret_cast<const std::uint16_t*>(base)[i]) * sd[c] + mean[c]) * 255;
          }
          return 0;
        };
        worst = std::max(worst, std::abs(level(from_gpu.data()) - level(twin.data())));
      }
      std::printf("GPU vs CPU twin, type %d, %s: max difference %.4f levels\n", static_cast<int>(type),
                  channels_last ? "NHWC" : "NCHW", worst);
      EXPECT_LE(worst, 1.0);
    }
  }
}

// Batches for the augmentation kernels: whole source images warped by a
// rotation (nearest or bilinear, sometimes after a vertical flip), a crop
// box of the rotated image, colour ops of every kind, flips and an erasure.
struct AugmentBatch {
  std::vector<ImageDesc> images;
  std::vector<device::AugmentDesc> augments;
  std::vector<std::uint8_t> pixels;
};

AugmentBatch RandomAugmentBatch(int count, unsigned seed, int min_side, int spread) {
  std::mt19937 rng(seed);
  AugmentBatch b;
  auto uniform = [&rng](double lo, double hi) { return lo + (hi - lo) * static_cast<double>(rng() % 100000) / 1e5; };
  for (int k = 0; k < count; ++k) {
    const int w = min_side + static_cast<int>(rng() % static_cast<unsigned>(spread));
    const int h = min_side + static_cast<int>(rng() % static_cast<unsigned>(spread));
    std::vector<transform::Step::PartWarp> warps;
    std::vector<transform::Size> sizes{{w, h}};
    if (rng() % 3 == 0) {
      warps.push_back({{1, 0, 0, 0, -1, static_cast<double>(h)}, transform::Interpolation::kNearest, {}, {w, h}});
      sizes.push_back({w, h});
    }
    const auto plan = transform::PlanRotation({w, h}, uniform(-30, 30), rng() % 2 == 0, std::nullopt);
    warps.push_back({plan.matrix,
                     rng() % 2 ? transform::Interpolation::kBilinear : transform::Interpolation::kNearest,
                     {static_cast<std::uint8_t>(rng() % 256), 7, 200},
                     plan.size});
    sizes.push_back(plan.size);
    device::AugmentDesc a;
    EXPECT_TRUE(device::KernelWarps(warps, sizes, a));
    a.region_width = w;
    a.region_height = h;
    const int cw = std::max(8, static_cast<int>(plan.size.width * uniform(0.3, 1.0)));
    const int ch = std::max(8, static_cast<int>(plan.size.height * uniform(0.3, 1.0)));
    a.crop_x = static_cast<int>(rng() % static_cast<unsigned>(plan.size.width - cw + 1));
    a.crop_y = static_cast<int>(rng() % static_cast<unsigned>(plan.size.height - ch + 1));
    transform::PixelProgram program;
    using Kind = transform::PixelOp::Kind;
    program.ops = {{Kind::kBrightness, uniform(0.6, 1.4)},
                   {Kind::kContrast, uniform(0.6, 1.4)},
                   {Kind::kSaturation, uniform(0.6, 1.4)},
                   {Kind::kHue, uniform(-0.1, 0.1)}};
    if (rng() % 4 == 0) program.ops.push_back({Kind::kGrayscale, 1});
    if (rng() % 2 == 0) program.ops.push_back({Kind::kFlipTopBottom, 1});
    if (rng() % 2 == 0) program.erases.push_back({3, 5, 20, 30, {-1.0f, 0.5f, 2.0f}});
    EXPECT_TRUE(device::DescribeProgram(program, rng() % 2 == 0, a).ok());
    ImageDesc d;
    d.offset = b.pixels.size();
    d.width = cw;
    d.height = ch;
    d.x1 = static_cast<float>(cw);
    d.y1 = static_cast<float>(ch);
    for (int i = 0; i < w * h * 3; ++i)
      b.pixels.push_back(static_cast<std::uint8_t>((i / 3 % w) * 3 + (i / 3 / w) * 2 + (rng() % 16)));
    b.images.push_back(d);
    b.augments.push_back(a);
  }
  return b;
}

TEST(Gpu, AugmentationKernelsMatchTheirCpuTwin) {
  REQUIRE_GPU();
  for (const OutputType type : {OutputType::kUint8, OutputType::kFloat32}) {
    AugmentBatch b = RandomAugmentBatch(24, 11 + static_cast<unsigned>(type), 60, 300);
    OutputDesc o;
    o.width = 96;
    o.height = 80;
    o.type = type;
    o.normalize = type != OutputType::kUint8;
    for (int c = 0; c < 3; ++c) o.mean[c] = 0.45f, o.inv_std[c] = 4.0f;
    const std::size_t count = b.images.size(), out_bytes = device::OutputImageBytes(o) * count;
    const std::size_t staging_bytes = static_cast<std::size_t>(o.width) * o.height * 3 * count;
    std::vector<std::byte> twin(out_bytes), from_gpu(out_bytes);
    std::vector<std::uint8_t> twin_staging(staging_bytes);
    device::AugmentOnCpu(b.pixels.data(), b.images, b.augments.data(), o, twin_staging.data(), twin.data());
    auto pixels = device::MakeDeviceMemory(*gpu, b.pixels.size());
    auto descs = device::MakeDeviceMemory(*gpu, count * sizeof(ImageDesc));
    auto augments = device::MakeDeviceMemory(*gpu, count * sizeof(device::AugmentDesc));
    auto staging = device::MakeDeviceMemory(*gpu, staging_bytes);
    auto out = device::MakeDeviceMemory(*gpu, out_bytes);
    auto stream = device::MakeStream(*gpu);
    ASSERT_TRUE(pixels.ok() && descs.ok() && augments.ok() && staging.ok() && out.ok() && stream.ok());
    ASSERT_EQ(cudaMemcpy(pixels->get(), b.pixels.data(), b.pixels.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(descs->get(), b.images.data(), count * sizeof(ImageDesc), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(
        cudaMemcpy(augments->get(), b.augments.data(), count * sizeof(device::AugmentDesc), cudaMemcpyHostToDevice),
        cudaSuccess);
    ASSERT_TRUE(gpu->LaunchAugment(static_cast<const std::uint8_t*>(pixels->get()), nullptr,
                                   static_cast<const ImageDesc*>(descs->get()),
                                   static_cast<const device::AugmentDesc*>(augments->get()),
                                   static_cast<std::int32_t>(count), o, static_cast<std::uint8_t*>(staging->get()),
                                   out->get(), stream->get())
                    .ok());
    ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(stream->get())), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(from_gpu.data(), out->get(), out_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<std::uint8_t> gpu_staging(staging_bytes);
    ASSERT_EQ(cudaMemcpy(gpu_staging.data(), staging->get(), staging_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    std::size_t staging_differ = 0, out_differ = 0;
    for (std::size_t i = 0; i < staging_bytes; ++i) staging_differ += gpu_staging[i] != twin_staging[i];
    for (std::size_t i = 0; i < out_bytes; ++i) out_differ += from_gpu[i] != twin[i];
    std::printf("augmentation kernels vs CPU twin, type %d: %zu of %zu staged values differ, %zu of %zu output bytes\n",
                static_cast<int>(type), staging_differ, staging_bytes, out_differ, out_bytes);
    // Without FMA contraction both evaluate the same IEEE operations in the same order.
    EXPECT_EQ(staging_differ, 0u);
    EXPECT_EQ(out_differ, 0u);
  }
}

TEST(Gpu, AugmentationKernelsThroughput) {
  REQUIRE_GPU();
  // ImageNet-like: 256 sources of about 500x375, rotated (bilinear), cropped, resized to 224, jittered.
  AugmentBatch b = RandomAugmentBatch(256, 5, 360, 200);
  OutputDesc o;
  o.width = o.height = 224;
  o.type = OutputType::kFloat32;
  const std::size_t count = b.images.size(), out_bytes = device::OutputImageBytes(o) * count;
  auto pixels = device::MakeDeviceMemory(*gpu, b.pixels.size());
  auto descs = device::MakeDeviceMemory(*gpu, count * sizeof(ImageDesc));
  auto augments = device::MakeDeviceMemory(*gpu, count * sizeof(device::AugmentDesc));
  auto staging = device::MakeDeviceMemory(*gpu, static_cast<std::size_t>(224) * 224 * 3 * count);
  auto out = device::MakeDeviceMemory(*gpu, out_bytes);
  auto stream = device::MakeStream(*gpu);
  auto start = device::MakeEvent(*gpu, true), end = device::MakeEvent(*gpu, true);
  ASSERT_TRUE(pixels.ok() && descs.ok() && augments.ok() && staging.ok() && out.ok() && stream.ok() && start.ok() &&
              end.ok());
  ASSERT_EQ(cudaMemcpy(pixels->get(), b.pixels.data(), b.pixels.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(descs->get(), b.images.data(), count * sizeof(ImageDesc), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(augments->get(), b.augments.data(), count * sizeof(device::AugmentDesc), cudaMemcpyHostToDevice),
            cudaSuccess);
  auto launch = [&] {
    return gpu->LaunchAugment(
        static_cast<const std::uint8_t*>(pixels->get()), nullptr, static_cast<const ImageDesc*>(descs->get()),
        static_cast<const device::AugmentDesc*>(augments->get()), static_cast<std::int32_t>(count), o,
        static_cast<std::uint8_t*>(staging->get()), out->get(), stream->get());
  };
  ASSERT_TRUE(launch().ok());  // warm-up
  constexpr int kRuns = 20;
  ASSERT_TRUE(gpu->RecordEvent(start->get(), stream->get()).ok());
  for (int i = 0; i < kRuns; ++i) ASSERT_TRUE(launch().ok());
  ASSERT_TRUE(gpu->RecordEvent(end->get(), stream->get()).ok());
  ASSERT_TRUE(gpu->SynchronizeEvent(end->get()).ok());
  auto ms = gpu->ElapsedMilliseconds(start->get(), end->get());
  ASSERT_TRUE(ms.ok());
  std::printf(
      "augmentation kernels: %.0f images/s (batch 256, 224x224 from ~450x450, rotation + jitter), %.2f ms "
      "per batch\n",
      kRuns * 256 / (*ms / 1000.0), *ms / kRuns);
}

TEST(Gpu, CopiesOverlapComputeOnTheConsumerStream) {
  REQUIRE_GPU();
  device::TransferOptions options;
  options.input_bytes = 64 << 20;  // 64 MiB batches: a copy takes milliseconds
  options.buffers = 2;
  options.timing = true;
  auto engine = device::TransferEngine::Create(*gpu, options);
  ASSERT_TRUE(engine.ok()) << engine.error().ToString();
  auto pinned = gpu->PinnedAlloc(options.input_bytes);
  ASSERT_TRUE(pinned.ok());
  device::PinnedMemory host(gpu, *pinned);
  std::memset(host.get(), 1, options.input_bytes);
  auto consumer = device::MakeStream(*gpu);
  auto compute_start = device::MakeEvent(*gpu, true), compute_end = device::MakeEvent(*gpu, true);
  auto sink = device::MakeDeviceMemory(*gpu, 64);
  ASSERT_TRUE(consumer.ok() && compute_start.ok() && compute_end.ok() && sink.ok());
  std::span<const std::byte> bytes(static_cast<const std::byte*>(host.get()), options.input_bytes);

  auto first = (*engine)->Submit(bytes);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE((*engine)->WaitOn(*first, consumer->get()).ok());
  // The consumer computes on batch 0 (a kernel of 2e7 clock cycles, about
  // 10 ms) while batch 1 copies.
  ASSERT_TRUE(gpu->RecordEvent(compute_start->get(), consumer->get()).ok());
  ASSERT_EQ(LaunchSpin(int64_t{2'000'000'000} / 100, static_cast<int*>(sink->get()), consumer->get()), 0);
  ASSERT_TRUE(gpu->RecordEvent(compute_end->get(), consumer->get()).ok());
  auto second = (*engine)->Submit(bytes);
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto ms = [&](device::EventHandle a, device::EventHandle b) { return *gpu->ElapsedMilliseconds(a, b); };
  const float compute_ms = ms(compute_start->get(), compute_end->get());
  const float copy_ms = *(*engine)->CopyMilliseconds(*second);
  std::printf("compute %.2f ms, copy of 64 MiB %.2f ms (%.1f GB/s)\n", compute_ms, copy_ms, 64.0 * 1.048576 / copy_ms);
  // The engine recorded the copy's start and end; test the overlap with them.
  const float copy_end_after_compute_start = ms(compute_start->get(), (*engine)->copied_event(*second));
  const float copy_end_before_compute_end = ms((*engine)->copied_event(*second), compute_end->get());
  std::printf("copy ended %.2f ms after compute started, %.2f ms before it ended\n", copy_end_after_compute_start,
              copy_end_before_compute_end);
  EXPECT_GT(compute_ms, 5.0f);
  EXPECT_GT(copy_end_after_compute_start, 0.0f);  // the copy ran during the compute...
  EXPECT_GT(copy_end_before_compute_end, 0.0f);   // ...and finished before it did: fully overlapped
  ASSERT_TRUE((*engine)->Release(*first, consumer->get()).ok());
  ASSERT_TRUE((*engine)->Release(*second, consumer->get()).ok());
}

TEST(Gpu, NoDeviceMemoryLeakedAfterManyEpochs) {
  REQUIRE_GPU();
  std::vector<std::byte> host(1 << 20, std::byte{3});
  auto consumer = device::MakeStream(*gpu);
  ASSERT_TRUE(consumer.ok());
  auto cycle = [&](int batches) {
    device::TransferOptions options;
    options.input_bytes = host.size();
    options.buffers = 3;
    auto engine = device::TransferEngine::Create(*gpu, options);
    ASSERT_TRUE(engine.ok());
    for (int i = 0; i < batches; ++i) {
      auto b = (*engine)->Submit(host);
      ASSERT_TRUE(b.ok()) << b.error().ToString();
      ASSERT_TRUE((*engine)->WaitOn(*b, consumer->get()).ok());
      ASSERT_TRUE((*engine)->Release(*b, consumer->get()).ok());
    }
  };
  cycle(10);  // warm up: the runtime's own one-time allocations
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::size_t free_before = 0, free_after = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  for (int epoch = 0; epoch < 50; ++epoch) cycle(40);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  std::printf("device memory free before %zu, after 50 epochs x 40 batches %zu\n", free_before, free_after);
  // The driver may keep a few pages for its own bookkeeping; a leak of the
  // pool (3 x 1 MiB per epoch) would show as 150 MiB.
  EXPECT_GE(free_after + (std::size_t{8} << 20), free_before);
}

// On a real GPU the host loader's pool is page-locked by cudaHostAlloc, and
// pinned as it is first used: a loop holding one batch at a time gets its
// batches in two pinned buffers, not prefetch + 1 (HostBuffer, Loader::Impl).
TEST(Gpu, APinnedPoolPinsTwoBuffersForALoopHoldingOneBatch) {
  REQUIRE_GPU();
  TempDir dir;
  auto dataset = MakeDataset(dir);
  LoaderOptions options = SmallOptions();
  options.batch_size = 16;
  options.threads = 1;  // 16 samples a thread: warm buffers only
  auto loader = Loader::Create(dataset, options);
  ASSERT_TRUE(loader.ok()) << loader.error().ToString();
  EXPECT_TRUE((*loader)->stats().pinned_memory);
  std::set<const void*> buffers;
  std::optional<Batch> held;
  for (int epoch = 0; epoch < 4; ++epoch) {
    while (true) {
      auto next = (*loader)->Next();
      ASSERT_TRUE(next.ok()) << next.error().ToString();
      if (!next->has_value()) break;
      cudaPointerAttributes attributes{};
      ASSERT_EQ(cudaPointerGetAttributes(&attributes, (**next).images()), cudaSuccess);
      EXPECT_EQ(attributes.type, cudaMemoryTypeHost);  // page-locked
      buffers.insert((**next).images());
      held.reset();
      held.emplace(std::move(**next));
    }
  }
  std::printf("pinned batch buffers a loop holding one used: %zu of a pool of %u\n", buffers.size(),
              (*loader)->stats().prefetch + 2);
  EXPECT_EQ(buffers.size(), 2u);
  EXPECT_EQ((*loader)->stats().batch_buffers_touched, 2u);
}

// One epoch through a DeviceLoader on the real GPU; the float32 images copied back.
Epoch DeviceEpoch(device::DeviceRuntime& gpu, std::shared_ptr<const Dataset> dataset, const LoaderOptions& options,
                  DeviceLoaderOptions device_options, DeviceLoaderStats* stats) {
  Epoch e;
  auto loader = device::CreateDeviceLoader(std::move(dataset), options, gpu, 0, device_options);
  EXPECT_TRUE(loader.ok()) << loader.error().ToString();
  if (!loader.ok()) return e;
  auto consumer = device::MakeStream(gpu);
  EXPECT_TRUE(consumer.ok());
  while (true) {
    auto next = (*loader)->Next(consumer->get());
    EXPECT_TRUE(next.ok()) << next.error().ToString();
    if (!next.ok() || !next->has_value()) break;
    const DeviceBatchView& b = **next;
    const auto bytes = static_cast<std::size_t>(b.shape[0] * b.shape[1] * b.shape[2] * b.shape[3]) * 4;
    const std::size_t at = e.pixels.size();
    e.pixels.resize(at + bytes);
    EXPECT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(consumer->get())), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(e.pixels.data() + at, b.images, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    e.indices.insert(e.indices.end(), b.indices.begin(), b.indices.end());
    EXPECT_TRUE((*loader)->Release(b, consumer->get()).ok());
  }
  *stats = (*loader)->stats();
  return e;
}

TEST(Gpu, NvjpegDecodeMatchesTheCpuDecodePath) {
  REQUIRE_GPU();
  std::string why;
  if (device::OpenNvjpegDecoder(&why) == nullptr) GTEST_SKIP() << "no nvJPEG: " << why;
  TempDir dir;
  auto dataset = MakeDataset(dir);
  LoaderOptions options = SmallOptions();
  options.transform.normalize = false;
  options.transform.dct_scaling = false;  // both paths resample full-size decodes: only the decoders differ
  for (bool random_crop : {false, true}) {
    if (random_crop) {
      options.transform.kind = TransformOptions::Kind::kRandomResizedCrop;
      options.transform.flip_probability = 0.5f;
    }
    DeviceLoaderOptions cpu_decode;
    cpu_decode.finish_on_device = true;
    DeviceLoaderOptions gpu_decode = cpu_decode;
    gpu_decode.decode_on_device = true;
    DeviceLoaderStats cpu_stats, gpu_stats;
    Epoch expected = DeviceEpoch(*gpu, dataset, options, cpu_decode, &cpu_stats);
    Epoch got = DeviceEpoch(*gpu, dataset, options, gpu_decode, &gpu_stats);
    ASSERT_EQ(got.indices, expected.indices);
    ASSERT_EQ(got.pixels.size(), expected.pixels.size());
    const auto* x = reinterpret_cast<const float*>(got.pixels.data());
    const auto* y = reinterpret_cast<const float*>(expected.pixels.data());
    double worst = 0, sum = 0;
    const std::size_t n = got.pixels.size() / 4;
    for (std::size_t i = 0; i < n; ++i) {
      const double d = std::abs(static_cast<double>(x[i]) - y[i]) * 255;
      worst = std::max(worst, d);
      sum += d;
    }
    std::printf(
        "GPU decode (%s) vs CPU decode, %s: max difference %.2f, mean %.3f levels; %llu on the GPU, %llu of "
        "them planned for the hardware decoder, %llu batch failures, %llu on the CPU after an error\n",
        gpu_stats.device_decoder.c_str(), random_crop ? "RandomResizedCrop" : "center crop", worst,
        sum / static_cast<double>(n), static_cast<unsigned long long>(gpu_stats.decoded_on_device),
        static_cast<unsigned long long>(gpu_stats.decoded_on_hardware),
        static_cast<unsigned long long>(gpu_stats.decode_batch_failures),
        static_cast<unsigned long long>(gpu_stats.decode_cpu_after_error));
    EXPECT_EQ(gpu_stats.decoded_on_device, 30u);
    EXPECT_EQ(gpu_stats.decode_cpu_after_error, 0u);
    // Decoders differ in IDCT and chroma upsampling: small on average, more at the test images' sharp edges.
    EXPECT_LT(sum / static_cast<double>(n), 1.5);
    EXPECT_LE(worst, 48.0);
  }
}

}  // namespace
}  // namespace stoker
