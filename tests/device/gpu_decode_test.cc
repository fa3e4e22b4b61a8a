// GPU decode (decode_on_device) through the fake runtime and a fake JPEG
// decoder that decodes on the host into the fake's "device" memory: which
// samples go to the GPU's decoders and which stay on the CPU (by reason),
// where the decode sits on the copy stream, the batch and image fallbacks,
// and that every path gives the CPU-decode path's images.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <thread>

#include <gtest/gtest.h>
#include <turbojpeg.h>

#include "codec/jpeg.h"
#include "device/device_loader_internal.h"
#include "device/jpeg_decoder.h"
#include "device_loader_test_util.h"
#include "fake_jpeg_decoder.h"
#include "fake_runtime.h"
#include "pipeline/loader_test_util.h"
#include "stoker/device_loader.h"

namespace stoker {
namespace {

// A JPEG whose header parses but whose data is cut short: the GPU refuses
// it, and so does the CPU.
std::string CutJpeg() {
  const std::string good = Encode(64, 48, 1, TJPF_RGB, TJSAMP_420, 0);
  return good.substr(0, good.size() / 3);
}

// A decoder that refuses every batch, and `jpeg` alone too.
std::shared_ptr<FakeDecoderState> RefusingState(testing::FakeDeviceRuntime& fake, const std::string& jpeg) {
  auto state = std::make_shared<FakeDecoderState>();
  state->fake = &fake;
  state->refuse_batches = true;
  state->refuse_alone.insert(jpeg.size());
  return state;
}

TEST(GpuDecode, GivesTheCpuDecodePathsImagesWithTheDecodeOnTheCopyStream) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  for (bool random_crop : {false, true}) {
    LoaderOptions options = ExactOptions();
    if (random_crop) {
      options.transform.kind = TransformOptions::Kind::kRandomResizedCrop;
      options.transform.flip_probability = 0.5f;
    }
    Epoch expected = CpuDecodeEpoch(dataset, options);
    testing::FakeDeviceRuntime fake;
    auto state = std::make_shared<FakeDecoderState>();
    state->fake = &fake;
    LoaderRun got = RunGpuDecode(dataset, options, GpuDecode(), fake, Opens(state));
    ASSERT_EQ(got.epoch.indices, expected.indices);
    EXPECT_LE(MaxFloatDifference(got.epoch, expected), 1e-5) << "random crop " << random_crop;
    EXPECT_EQ(got.stats.device_decoder, "fake nvJPEG");
    EXPECT_EQ(got.stats.decoded_on_device, 30u);
    EXPECT_GE(got.stats.decoded_on_hardware, 30u);  // baseline 4:2:0: the hardware decoder's (batches ahead count too)
    EXPECT_EQ(state->hardware_jobs, 30);
    EXPECT_TRUE(got.stats.decoded_on_cpu_by_reason.empty());
    EXPECT_EQ(got.stats.decode_no_room + got.stats.decode_batch_failures + got.stats.decode_cpu_after_error, 0u);
    // Per batch, on the copy stream: the copy, then the decode, then the kernel.
    std::vector<std::string> order;
    for (const auto& line : fake.log)
      if (line.starts_with("copy ") || line.starts_with("jpeg decode") || line.starts_with("preprocess "))
        order.push_back(line.substr(0, line.find(' ')));
    ASSERT_EQ(order.size(), 24u);
    for (std::size_t i = 0; i < order.size(); i += 3) {
      EXPECT_EQ(order[i], "copy");
      EXPECT_EQ(order[i + 1], "jpeg");
      EXPECT_EQ(order[i + 2], "preprocess");
    }
    std::string copy_stream;
    for (const auto& line : fake.log)
      if (line.starts_with("copy ")) copy_stream = line.substr(line.rfind(' ') + 1);
    for (const auto& line : fake.log) {
      if (line.starts_with("jpeg decode")) {
        EXPECT_TRUE(line.ends_with(" " + copy_stream)) << line;
      }
    }
  }
}

TEST(GpuDecode, WithDctScalingDiffersFromTheCpuDecodePathOnlyAsAScaledDecodeDoes) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  LoaderOptions options = SmallOptions();
  options.transform.normalize = false;
  options.transform.width = options.transform.height = 12;  // the CPU path decodes at 1/2 or 1/4 scale here
  Epoch expected = CpuDecodeEpoch(dataset, options);
  testing::FakeDeviceRuntime fake;
  auto state = std::make_shared<FakeDecoderState>();
  state->fake = &fake;
  LoaderRun got = RunGpuDecode(dataset, options, GpuDecode(), fake, Opens(state));
  ASSERT_EQ(got.epoch.indices, expected.indices);
  // The GPU path resamples the full-size decode; the CPU path a DCT-scaled
  // one (a box filter in the DCT domain). On these sawtooth test images the
  // two differ at the teeth's edges, little elsewhere.
  const auto* x = reinterpret_cast<const float*>(got.epoch.pixels.data());
  const auto* y = reinterpret_cast<const float*>(expected.pixels.data());
  const std::size_t n = got.epoch.pixels.size() / 4;
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += std::abs(static_cast<double>(x[i]) - y[i]) * 255;
  std::printf("GPU decode (full size) vs CPU decode (DCT-scaled): mean %.2f levels\n", sum / static_cast<double>(n));
  EXPECT_GT(sum, 0) << "the CPU path was meant to use DCT scaling";
  EXPECT_LT(sum / static_cast<double>(n), 6.0);
}

TEST(GpuDecode, RoutesWhatTheGpuDoesNotTakeToTheCpuByReason) {
  TempDir dir;
  // Baseline colour, progressive, grey and CMYK images; the large ones do not fit a small decode area.
  WriteFile(dir / "src/a/0.jpg", Encode(64, 48, 1, TJPF_RGB, TJSAMP_420, 0));
  WriteFile(dir / "src/a/1.jpg", Encode(72, 40, 2, TJPF_RGB, TJSAMP_444, TJFLAG_PROGRESSIVE));
  WriteFile(dir / "src/a/2.jpg", Encode(50, 50, 3, TJPF_GRAY, TJSAMP_GRAY, 0));
  WriteFile(dir / "src/a/3.jpg", Encode(48, 64, 4, TJPF_CMYK, TJSAMP_444, 0));
  WriteFile(dir / "src/b/0.jpg", Encode(400, 300, 5, TJPF_RGB, TJSAMP_420, 0));
  WriteFile(dir / "src/b/1.jpg", Encode(66, 44, 6, TJPF_RGB, TJSAMP_422, 0));
  WriteFile(dir / "src/b/2.jpg", Encode(44, 66, 7, TJPF_RGB, TJSAMP_420, TJFLAG_PROGRESSIVE));
  WriteFile(dir / "src/b/3.jpg", Encode(300, 400, 8, TJPF_RGB, TJSAMP_420, 0));
  auto dataset = PackSource(dir);

  LoaderOptions options = ExactOptions();
  options.shuffle = false;
  Epoch expected = CpuDecodeEpoch(dataset, options);
  for (bool hardware : {true, false}) {
    testing::FakeDeviceRuntime fake;
    auto state = std::make_shared<FakeDecoderState>();
    state->fake = &fake;
    state->hardware = hardware;
    DeviceLoaderOptions device = GpuDecode();
    device.device_decode_bytes_per_sample = 64 << 10;  // 256 KiB a batch of 4: a 400x300 image (360 KB) does not fit
    device.device_input_factor = 16;                   // room for the compressed bytes beside the CPU's crops
    LoaderRun got = RunGpuDecode(dataset, options, device, fake, Opens(state));
    ASSERT_EQ(got.epoch.indices, expected.indices);
    EXPECT_LE(MaxFloatDifference(got.epoch, expected), 1e-5);
    EXPECT_EQ(got.stats.decoded_on_device, 5u) << "hardware " << hardware;  // colour, progressive, grey
    // The finisher's counts include batches the loader prepared ahead (of the next epoch).
    EXPECT_GE(got.stats.decode_no_room, 2u);
    ASSERT_EQ(got.stats.decoded_on_cpu_by_reason.size(), 1u);
    EXPECT_EQ(got.stats.decoded_on_cpu_by_reason[0].first, "CMYK or YCCK");
    EXPECT_GE(got.stats.decoded_on_cpu_by_reason[0].second, 1u);
    // The hardware decoder takes baseline (colour and grey), not progressive.
    EXPECT_EQ(state->hardware_jobs, hardware ? 3 : 0);
  }
}

TEST(GpuDecode, ARefusedBatchIsDecodedImageByImageAndOnTheCpuWhenTheGpuRefusesAnImage) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  LoaderOptions options = ExactOptions();
  Epoch expected = CpuDecodeEpoch(dataset, options);
  testing::FakeDeviceRuntime fake;
  auto state = std::make_shared<FakeDecoderState>();
  state->fake = &fake;
  state->refuse_batches = true;
  // Refuse two images alone too (by their sizes in the dataset).
  for (std::uint64_t i : {3u, 17u}) {
    auto bytes = dataset->ReadField(i, *dataset->FieldIndex("jpg"));
    ASSERT_TRUE(bytes.ok());
    state->refuse_alone.insert(bytes->size());
  }
  LoaderRun got = RunGpuDecode(dataset, options, GpuDecode(), fake, Opens(state));
  ASSERT_EQ(got.epoch.indices, expected.indices);
  EXPECT_LE(MaxFloatDifference(got.epoch, expected), 1e-5);
  EXPECT_EQ(got.stats.decode_batch_failures, 8u);
  EXPECT_EQ(got.stats.decode_cpu_after_error, 2u);
  EXPECT_EQ(got.stats.decoded_on_device, 28u);
  EXPECT_EQ(state->ones, 30);
}

TEST(GpuDecode, AnImageNeitherTheGpuNorTheCpuDecodesIsAnErrorNamingTheSample) {
  TempDir dir;
  const std::string cut = CutJpeg();
  WriteFile(dir / "src/a/0.jpg", Encode(60, 40, 2, TJPF_RGB, TJSAMP_420, 0));
  WriteFile(dir / "src/a/1.jpg", cut);
  auto dataset = PackSource(dir);
  testing::FakeDeviceRuntime fake;
  auto state = RefusingState(fake, cut);
  LoaderOptions options = ExactOptions();
  options.shuffle = false;
  DeviceLoaderOptions device = GpuDecode();
  device.device_buffers = 2;
  auto loader = device::CreateDeviceLoader(dataset, options, fake, 0, device, Opens(state));
  ASSERT_TRUE(loader.ok());
  auto next = (*loader)->Next(reinterpret_cast<void*>(std::uintptr_t{77}));
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.error().code(), StatusCode::kCorruption) << next.error().ToString();
  std::printf("%s\n", next.error().ToString().c_str());
  EXPECT_NE(next.error().message().find("sample 'a/1'"), std::string::npos) << next.error().message();
  EXPECT_NE(next.error().message().find(".tar:"), std::string::npos) << next.error().message();
}

// on_corrupt = kSkip, as on the CPU path: the corrupt image's place gets
// the next good image of its batch (pixels, label, index), counted; a batch
// with no good image left still fails, naming the sample.
TEST(GpuDecode, WithSkipAnImageNeitherDecodesIsReplacedByTheNextGoodOneOfItsBatch) {
  TempDir dir;
  const std::string cut = CutJpeg();
  WriteFile(dir / "src/a/0.jpg", Encode(60, 40, 2, TJPF_RGB, TJSAMP_420, 0));
  WriteFile(dir / "src/a/1.jpg", cut);
  WriteFile(dir / "src/b/2.jpg", Encode(56, 44, 3, TJPF_RGB, TJSAMP_420, 0));
  WriteFile(dir / "src/b/3.jpg", cut);  // the batch's last: replaced by the one before it
  auto dataset = PackSource(dir);
  testing::FakeDeviceRuntime fake;
  auto state = RefusingState(fake, cut);
  LoaderOptions options = ExactOptions();
  options.shuffle = false;
  options.on_corrupt = CorruptPolicy::kSkip;
  LoaderRun got = RunGpuDecode(dataset, options, GpuDecode(), fake, Opens(state));
  ASSERT_EQ(got.epoch.indices, (std::vector<std::uint64_t>{0, 2, 2, 2}));
  ASSERT_EQ(got.epoch.labels.size(), 4u);
  EXPECT_NE(got.epoch.labels[0], got.epoch.labels[2]);  // a and b
  EXPECT_EQ(got.epoch.labels[1], got.epoch.labels[2]);
  EXPECT_EQ(got.epoch.labels[3], got.epoch.labels[2]);
  const std::size_t image = got.epoch.pixels.size() / 4;
  auto pixels = [&](std::size_t k) { return std::span(got.epoch.pixels).subspan(k * image, image); };
  EXPECT_TRUE(std::ranges::equal(pixels(1), pixels(2)));
  EXPECT_TRUE(std::ranges::equal(pixels(3), pixels(2)));
  EXPECT_FALSE(std::ranges::equal(pixels(0), pixels(2)));
  EXPECT_EQ(got.stats.decode_corrupt_skipped, 2u);
  EXPECT_EQ(got.stats.decoded_on_device, 2u);

  // With augmentation steps the replacement takes the good image's drawn
  // steps too (its AugmentDesc), so the two places hold the same image.
  options.transform.after_crop = {TransformStep{"ColorJitter", {{"brightness", {0.6}}, {"hue", {0.2}}}, {}, {}}};
  testing::FakeDeviceRuntime fake_augmented;
  auto augmented_state = RefusingState(fake_augmented, cut);
  LoaderRun augmented = RunGpuDecode(dataset, options, GpuDecode(), fake_augmented, Opens(augmented_state));
  ASSERT_EQ(augmented.epoch.indices, (std::vector<std::uint64_t>{0, 2, 2, 2}));
  auto augmented_pixels = [&](std::size_t k) { return std::span(augmented.epoch.pixels).subspan(k * image, image); };
  EXPECT_TRUE(std::ranges::equal(augmented_pixels(1), augmented_pixels(2)));
  EXPECT_TRUE(std::ranges::equal(augmented_pixels(3), augmented_pixels(2)));
  EXPECT_FALSE(std::ranges::equal(augmented_pixels(2), pixels(2)));  // jittered
  options.transform.after_crop.clear();

  // A batch whose every image is corrupt has nothing to replace them with.
  TempDir bad_dir;
  WriteFile(bad_dir / "src/a/0.jpg", cut);
  auto bad = PackSource(bad_dir);
  DeviceLoaderOptions device = GpuDecode();
  device.device_buffers = 2;
  auto loader = device::CreateDeviceLoader(bad, options, fake, 0, device, Opens(state));
  ASSERT_TRUE(loader.ok());
  auto next = (*loader)->Next(reinterpret_cast<void*>(std::uintptr_t{77}));
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.error().code(), StatusCode::kCorruption) << next.error().ToString();
  EXPECT_NE(next.error().message().find("sample 'a/0'"), std::string::npos) << next.error().message();
  EXPECT_NE(next.error().message().find("none can replace it"), std::string::npos) << next.error().message();
}

std::vector<std::uint64_t> NextIndices(DeviceLoader& loader) {
  auto consumer = reinterpret_cast<void*>(std::uintptr_t{77});
  auto next = loader.Next(consumer);
  EXPECT_TRUE(next.ok()) << next.error().ToString();
  if (!next.ok() || !next->has_value()) return {};
  std::vector<std::uint64_t> indices = (*next)->indices;
  EXPECT_TRUE(loader.Release(**next, consumer).ok());
  return indices;
}

// stage_ahead (the default with a decoder): the decoder runs on the staging
// thread, never on the consumer's, and the position, epoch, resume and
// set_epoch the consumer sees count only the batches it took.
TEST(GpuDecode, StagingAheadDecodesOffTheConsumersThreadAndKeepsItsPosition) {
  TempDir dir;
  auto dataset = MakeDataset(dir);  // 30 samples: 8 batches of 4 an epoch
  LoaderOptions options = ExactOptions();
  testing::FakeDeviceRuntime fake;
  auto state = std::make_shared<FakeDecoderState>();
  state->fake = &fake;
  DeviceLoaderOptions device = GpuDecode();
  device.device_buffers = 3;
  DeviceLoaderOptions unstaged = device;
  unstaged.stage_ahead = false;
  auto reference = device::CreateDeviceLoader(dataset, options, fake, 0, unstaged, Opens(state));
  ASSERT_TRUE(reference.ok());
  std::vector<std::vector<std::uint64_t>> epoch0;
  for (int b = 0; b < 8; ++b) epoch0.push_back(NextIndices(**reference));
  (*reference)->SetEpoch(5);
  const std::vector<std::uint64_t> epoch5_first = NextIndices(**reference);
  reference->reset();
  {
    std::lock_guard<std::mutex> lock(state->threads_mu);
    state->threads.clear();
  }
  state->batches = 0;

  auto loader = device::CreateDeviceLoader(dataset, options, fake, 0, device, Opens(state));
  ASSERT_TRUE(loader.ok());
  for (int b = 0; b < 3; ++b) EXPECT_EQ(NextIndices(**loader), epoch0[static_cast<std::size_t>(b)]);
  // Wait until the staging thread has decoded ahead (every buffer free: up to 3 batches).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (state->batches < 6 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(state->batches, 6);
  EXPECT_EQ((*loader)->loader().state().batches_consumed, 6u);  // the host loader is ahead
  const LoaderState here = (*loader)->State();
  EXPECT_EQ(here.batches_consumed, 3u);
  EXPECT_EQ(here.epoch, 0u);
  EXPECT_EQ((*loader)->epoch(), 0u);
  // Resuming elsewhere at that state gives what this loader gives next.
  auto resumed_state = std::make_shared<FakeDecoderState>();  // decodes on this thread: counted apart
  resumed_state->fake = &fake;
  auto resumed = device::CreateDeviceLoader(dataset, options, fake, 0, unstaged, Opens(resumed_state));
  ASSERT_TRUE(resumed.ok());
  ASSERT_TRUE((*resumed)->Restore(here).ok());
  for (int b = 3; b < 8; ++b) {
    EXPECT_EQ(NextIndices(**resumed), epoch0[static_cast<std::size_t>(b)]);
    EXPECT_EQ(NextIndices(**loader), epoch0[static_cast<std::size_t>(b)]);
  }
  EXPECT_TRUE(NextIndices(**loader).empty());  // the epoch's end
  // Nothing of the next epoch is staged before the consumer asks for it.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(state->batches, 8);  // epoch 0's, no more
  EXPECT_EQ((*loader)->State().epoch, 1u);
  EXPECT_EQ((*loader)->State().batches_consumed, 0u);
  // set_epoch mid-epoch drops what was staged.
  EXPECT_FALSE(NextIndices(**loader).empty());
  EXPECT_FALSE(NextIndices(**loader).empty());
  (*loader)->SetEpoch(5);
  EXPECT_EQ((*loader)->epoch(), 5u);
  EXPECT_EQ(NextIndices(**loader), epoch5_first);
  loader->reset();
  resumed->reset();
  std::lock_guard<std::mutex> lock(state->threads_mu);
  EXPECT_FALSE(state->threads.contains(std::this_thread::get_id()));
  EXPECT_FALSE(state->threads.empty());
  EXPECT_EQ(fake.live_device_allocations, 0);
}

// With staging, a consumer holding every device buffer gets an error, not a hang.
TEST(GpuDecode, StagingWithEveryBufferHeldIsAnErrorNotAHang) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  testing::FakeDeviceRuntime fake;
  auto state = std::make_shared<FakeDecoderState>();
  state->fake = &fake;
  DeviceLoaderOptions device = GpuDecode();
  device.device_buffers = 2;
  auto loader = device::CreateDeviceLoader(dataset, ExactOptions(), fake, 0, device, Opens(state));
  ASSERT_TRUE(loader.ok());
  auto consumer = reinterpret_cast<void*>(std::uintptr_t{77});
  auto a = (*loader)->Next(consumer);
  auto b = (*loader)->Next(consumer);
  ASSERT_TRUE(a.ok() && b.ok() && a->has_value() && b->has_value());
  auto c = (*loader)->Next(consumer);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code(), StatusCode::kResourceExhausted) << c.error().ToString();
  // Released, a buffer is staged again.
  ASSERT_TRUE((*loader)->Release(**a, consumer).ok());
  auto d = (*loader)->Next(consumer);
  ASSERT_TRUE(d.ok()) << d.error().ToString();
  EXPECT_TRUE(d->has_value());
}

TEST(GpuDecode, WithoutADecoderTheCpuDecodesAndTheStatsSayWhy) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  LoaderOptions options = ExactOptions();
  Epoch expected = CpuDecodeEpoch(dataset, options);
  testing::FakeDeviceRuntime fake;
  auto none = [](std::string* why) -> std::unique_ptr<device::DeviceJpegDecoder> {
    *why = "nvJPEG is not installed (test)";
    return nullptr;
  };
  LoaderRun got = RunGpuDecode(dataset, options, GpuDecode(), fake, none);
  ASSERT_EQ(got.epoch.indices, expected.indices);
  EXPECT_EQ(got.epoch.pixels, expected.pixels);
  EXPECT_EQ(got.stats.device_decoder, "CPU: nvJPEG is not installed (test)");
  EXPECT_EQ(got.stats.decoded_on_device, 0u);
}

TEST(GpuDecode, OptionsAreChecked) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  testing::FakeDeviceRuntime fake;
  DeviceLoaderOptions d;
  d.decode_on_device = true;  // without finish_on_device
  auto made = device::CreateDeviceLoader(dataset, SmallOptions(), fake, 0, d);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.error().message().find("needs finish_on_device"), std::string::npos);
  d.finish_on_device = true;
  d.device_decode_bytes_per_sample = 1000;
  made = device::CreateDeviceLoader(dataset, SmallOptions(), fake, 0, d);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.error().message().find("device_decode_bytes_per_sample"), std::string::npos);
}

TEST(GpuDecode, NvjpegWithoutAGpuSaysWhy) {
  if (QueryCuda().device_count > 0) GTEST_SKIP() << "this machine has a GPU";
  // The real library when scripts/deps fetched it (it loads here, then finds no driver), else a path that does not
  // exist.
  const char* fetched = STOKER_SOURCE_DIR "/.deps/nvjpeg/lib/libnvjpeg.so.12";
  const bool have_library = std::filesystem::exists(fetched);
  setenv("STOKER_NVJPEG_LIBRARY", have_library ? fetched : "/nonexistent/libnvjpeg.so.12", 1);
  std::string why;
  auto decoder = device::OpenNvjpegDecoder(&why);
  EXPECT_EQ(decoder, nullptr);
  std::printf("without a GPU: %s\n", why.c_str());
  EXPECT_FALSE(why.empty());
  if (have_library) {
    EXPECT_TRUE(why.find("nvjpegCreateEx") != std::string::npos || why.find("without") != std::string::npos) << why;
  } else {
    EXPECT_TRUE(why.find("not installed") != std::string::npos || why.find("without") != std::string::npos) << why;
  }
}

}  // namespace
}  // namespace stoker
