// The device path without a GPU: the CPU twin of the preprocessing kernel
// against an independent reference, the transfer engine's ordering through
// a recording fake runtime, and device selection / fallback.
#include <cmath>
#include <cstring>
#include <random>

#include <gtest/gtest.h>

#include "device/preprocess_cpu.h"
#include "device/transfer_engine.h"
#include "fake_runtime.h"
#include "stoker/device.h"

namespace stoker {
namespace {

using device::ImageDesc;
using device::OutputDesc;
using device::OutputType;

std::vector<std::uint8_t> RandomImage(int w, int h, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> px(static_cast<std::size_t>(w) * h * 3);
  for (auto& p : px) p = static_cast<std::uint8_t>(rng() & 0xff);
  return px;
}

// An independent, double-precision statement of the semantics: separable
// triangle filter, widened by the scale when shrinking, over the box's
// pixels; flip mirrors the output; normalise (v / 255 - mean) / std.
double Reference(const std::vector<std::uint8_t>& px, int w, int h, const ImageDesc& d, int ow, int oh, int ox, int oy,
                 int c) {
  auto axis = [](int o, int n, double b0, double b1, int size, std::vector<std::pair<int, double>>& taps) {
    const double scale = (b1 - b0) / n, support = std::max(scale, 1.0), center = b0 + (o + 0.5) * scale;
    const int lo = std::max(static_cast<int>(std::floor(b0)), 0);
    const int hi = std::min(static_cast<int>(std::floor(b1 - 1e-4)), size - 1);
    for (int i = lo; i <= hi; ++i) {
      const double wgt = 1.0 - std::abs((i + 0.5 - center) / support);
      if (wgt > 0) taps.emplace_back(i, wgt);
    }
  };
  std::vector<std::pair<int, double>> tx, ty;
  axis(d.flip ? ow - 1 - ox : ox, ow, d.x0, d.x1, w, tx);
  axis(oy, oh, d.y0, d.y1, h, ty);
  double acc = 0, sum = 0;
  for (auto [j, wy] : ty)
    for (auto [i, wx] : tx) {
      acc += wy * wx * px[(static_cast<std::size_t>(j) * w + i) * 3 + c];
      sum += wy * wx;
    }
  return acc / sum;
}

TEST(CpuTwin, MatchesTheReferenceForShrinkGrowCropAndFlip) {
  const int w = 97, h = 61;
  auto px = RandomImage(w, h, 1);
  struct Case {
    ImageDesc desc;
    int ow, oh;
  };
  const std::vector<Case> cases = {
      {{0, w, h, 0, 0, float(w), float(h), 0, 0}, 24, 16},    // shrink ~4x: antialiased
      {{0, w, h, 10.5f, 3.25f, 30.5f, 20.0f, 1, 0}, 40, 34},  // grow a fractional crop, flipped
      {{0, w, h, 5, 5, 5 + 32, 5 + 32, 0, 0}, 32, 32},        // 1:1 crop: a copy
      {{0, w, h, 0, 0, float(w), float(h), 1, 0}, 97, 61},    // flip only
  };
  for (const auto& c : cases) {
    OutputDesc o;
    o.width = c.ow;
    o.height = c.oh;
    o.type = OutputType::kFloat32;
    o.normalize = 0;
    std::vector<float> out(static_cast<std::size_t>(c.ow) * c.oh * 3);
    device::PreprocessOnCpu(px.data(), std::span(&c.desc, 1), o, out.data());
    double worst = 0;
    for (int ch = 0; ch < 3; ++ch)
      for (int y = 0; y < c.oh; ++y)
        for (int x = 0; x < c.ow; ++x) {
          const double want = Reference(px, w, h, c.desc, c.ow, c.oh, x, y, ch) / 255.0;
          worst = std::max(worst, std::abs(out[(static_cast<std::size_t>(ch) * c.oh + y) * c.ow + x] - want));
        }
    EXPECT_LT(worst * 255, 1e-3) << c.ow << "x" << c.oh;
  }
  // The 1:1 crop and the pure flip are exact copies.
  OutputDesc o;
  o.width = w;
  o.height = h;
  o.type = OutputType::kUint8;
  o.channels_last = 1;
  std::vector<std::uint8_t> flipped(px.size());
  const ImageDesc flip{0, w, h, 0, 0, float(w), float(h), 1, 0};
  device::PreprocessOnCpu(px.data(), std::span(&flip, 1), o, flipped.data());
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int ch = 0; ch < 3; ++ch)
        ASSERT_EQ(flipped[(static_cast<std::size_t>(y) * w + x) * 3 + ch],
                  px[(static_cast<std::size_t>(y) * w + (w - 1 - x)) * 3 + ch]);
}

TEST(CpuTwin, NormaliseLayoutsAndDtypes) {
  const int w = 8, h = 4;
  std::vector<std::uint8_t> px(w * h * 3);
  for (std::size_t i = 0; i < px.size(); ++i) px[i] = static_cast<std::uint8_t>(i * 7);
  const ImageDesc desc{0, w, h, 0, 0, float(w), float(h), 0, 0};
  OutputDesc o;
  o.width = w;
  o.height = h;
  o.mean[0] = 0.485f, o.mean[1] = 0.456f, o.mean[2] = 0.406f;
  o.inv_std[0] = 1 / 0.229f, o.inv_std[1] = 1 / 0.224f, o.inv_std[2] = 1 / 0.225f;
  std::vector<float> nchw(w * h * 3);
  device::PreprocessOnCpu(px.data(), std::span(&desc, 1), o, nchw.data());
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < w * h; ++i) {
      const float want = (px[i * 3 + c] / 255.0f - o.mean[c]) * o.inv_std[c];
      ASSERT_NEAR(nchw[c * w * h + i], want, 1e-5);
    }
  // float16 and bfloat16 round to nearest even from the float32 value.
  for (auto type : {OutputType::kFloat16, OutputType::kBFloat16}) {
    o.type = type;
    std::vector<std::uint16_t> half(w * h * 3);
    device::PreprocessOnCpu(px.data(), std::span(&desc, 1), o, half.data());
    for (std::size_t i = 0; i < half.size(); ++i) {
      const auto bits = type == OutputType::kFloat16 ? FloatToHalfBits(nchw[i]) : FloatToBFloat16Bits(nchw[i]);
      ASSERT_EQ(half[i], bits);
    }
  }
}

device::TransferOptions SmallEngine() {
  device::TransferOptions o;
  o.input_bytes = 1024;
  o.buffers = 2;
  return o;
}

TEST(TransferEngine, CopiesOnItsOwnStreamAndHandsOverThroughEvents) {
  testing::FakeDeviceRuntime fake;
  {
    auto engine = device::TransferEngine::Create(fake, SmallEngine());
    ASSERT_TRUE(engine.ok()) << engine.error().ToString();
    auto& e = **engine;
    const auto copy = testing::FakeDeviceRuntime::Id(e.copy_stream());
    const device::StreamHandle consumer = reinterpret_cast<device::StreamHandle>(std::uintptr_t{77});
    std::vector<std::byte> host(100, std::byte{5});

    fake.log.clear();
    auto b0 = e.Submit(host);
    ASSERT_TRUE(b0.ok());
    ASSERT_TRUE(e.WaitOn(*b0, consumer).ok());
    EXPECT_EQ(std::memcmp(b0->data, host.data(), 100), 0);
    ASSERT_EQ(fake.log.size(), 4u);
    EXPECT_EQ(fake.log[0], fmt::format("copy 100 bytes on stream {}", copy));
    EXPECT_TRUE(fake.log[1].starts_with("record event") && fake.log[1].ends_with(fmt::format("stream {}", copy)));
    EXPECT_TRUE(fake.log[3].starts_with("stream 77 waits for event"));  // the ready event, no host wait
    for (const auto& line : fake.log) EXPECT_EQ(line.find("host waits"), std::string::npos) << line;

    // Batch 1 goes to the other buffer while the consumer holds batch 0.
    auto b1 = e.Submit(host);
    ASSERT_TRUE(b1.ok());
    EXPECT_NE(b1->data, b0->data);
    EXPECT_EQ(e.free_slots(), 0u);
    // A third batch would need a buffer the consumer holds: an error, not a hang.
    auto b2 = e.Submit(host);
    ASSERT_FALSE(b2.ok());
    EXPECT_EQ(b2.error().code(), StatusCode::kResourceExhausted);

    // Releasing batch 0 records an event on the consumer's stream; the copy
    // that reuses its buffer first waits (on the GPU) for that event.
    fake.log.clear();
    ASSERT_TRUE(e.Release(*b0, consumer).ok());
    ASSERT_EQ(fake.log.size(), 1u);
    const std::string released = fake.log[0].substr(std::string("record event ").size());
    const std::string released_event = released.substr(0, released.find(' '));
    EXPECT_TRUE(fake.log[0].ends_with("on stream 77"));
    ASSERT_TRUE(e.WaitCopied(*b1).ok());  // the host may now reuse batch 1's host buffer
    fake.log.clear();
    auto b3 = e.Submit(host);
    ASSERT_TRUE(b3.ok());
    EXPECT_EQ(b3->data, b0->data);
    EXPECT_EQ(fake.log[0], fmt::format("stream {} waits for event {}", copy, released_event));
    EXPECT_TRUE(fake.log[1].starts_with("copy"));
    EXPECT_FALSE(e.Release(*b0, consumer).ok());  // already released: a stale handle
    ASSERT_TRUE(e.Release(*b1, consumer).ok());
    ASSERT_TRUE(e.Release(*b3, consumer).ok());
  }
  // Nothing leaks: every buffer, stream and event was freed.
  EXPECT_EQ(fake.live_device_allocations, 0);
  EXPECT_EQ(fake.live_streams, 0);
  EXPECT_EQ(fake.live_events, 0);
}

TEST(TransferEngine, FinishesPreprocessingOnTheCopyStream) {
  testing::FakeDeviceRuntime fake;
  const int w = 40, h = 30, out = 16;
  auto px = RandomImage(w, h, 3);
  device::PreprocessJob job;
  job.count = 2;
  job.output.width = job.output.height = out;
  job.pixels_offset = 2 * sizeof(ImageDesc);
  std::vector<ImageDesc> descs = {{0, w, h, 2, 3, 34, 27, 0, 0}, {0, w, h, 0, 0, float(w), float(h), 1, 0}};
  std::vector<std::byte> host(job.pixels_offset + px.size());
  std::memcpy(host.data(), descs.data(), job.pixels_offset);
  std::memcpy(host.data() + job.pixels_offset, px.data(), px.size());

  device::TransferOptions options;
  options.input_bytes = host.size();
  options.output_bytes = 2 * device::OutputImageBytes(job.output);
  auto engine = device::TransferEngine::Create(fake, options);
  ASSERT_TRUE(engine.ok());
  auto batch = (*engine)->Submit(host, &job);
  ASSERT_TRUE(batch.ok()) << batch.error().ToString();
  std::vector<float> twin(2 * out * out * 3);
  device::PreprocessOnCpu(px.data(), descs, job.output, twin.data());
  EXPECT_EQ(batch->bytes, twin.size() * 4);
  EXPECT_EQ(std::memcmp(batch->data, twin.data(), batch->bytes), 0);
  EXPECT_TRUE(fake.log[2].starts_with("preprocess 2 images on stream"));
}

TEST(TransferEngine, ReportsAllocationFailuresWithoutLeaking) {
  testing::FakeDeviceRuntime fake;
  fake.fail_device_alloc_after = 1;
  auto engine = device::TransferEngine::Create(fake, SmallEngine());
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.error().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(engine.error().message().find("device buffer 1 of 2"), std::string::npos) << engine.error().message();
  EXPECT_EQ(fake.live_device_allocations, 0);
  EXPECT_EQ(fake.live_streams, 0);
  EXPECT_EQ(fake.live_events, 0);
}

TEST(Device, ParsesAndFallsBackWithoutAGpu) {
  EXPECT_EQ(ParseDevice("cpu")->kind, DeviceKind::kCpu);
  auto cuda1 = ParseDevice("cuda:1");
  ASSERT_TRUE(cuda1.ok());
  EXPECT_EQ(cuda1->kind, DeviceKind::kCuda);
  EXPECT_EQ(cuda1->index, 1);
  EXPECT_EQ(cuda1->ToString(), "cuda:1");
  EXPECT_EQ(ParseDevice("cuda")->index, 0);
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:x", ""}) EXPECT_FALSE(ParseDevice(bad).ok()) << bad;

  const CudaAvailability cuda = QueryCuda();
  if (cuda.device_count == 0) {
    // This machine: no GPU. Asking for one falls back to the CPU with a reason.
    EXPECT_FALSE(cuda.reason.empty());
    auto resolved = ResolveDevice("cuda");
    ASSERT_TRUE(resolved.ok());
    EXPECT_EQ(resolved->device.kind, DeviceKind::kCpu);
    EXPECT_NE(resolved->note.find("using the CPU"), std::string::npos) << resolved->note;
  }
  auto cpu = ResolveDevice("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_TRUE(cpu->note.empty());
  EXPECT_FALSE(ResolveDevice("tpu").ok());
}

}  // namespace
}  // namespace stoker
