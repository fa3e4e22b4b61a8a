// GPU decode of a seekable pack (`pack --seekable-jpeg`): a random crop
// that leaves whole restart intervals out sends the decoder the JPEG of the
// intervals its region needs, not the whole file, and the batch is the
// same as from the whole file.
#include <gtest/gtest.h>
#include <turbojpeg.h>

#include "fake_jpeg_decoder.h"
#include "stoker/pack.h"

namespace stoker {
namespace {

// Photos big enough for a grid of intervals (256 x 192, 4:2:0: 16 MCUs to
// a row, 12 rows), packed plain and seekable.
void WriteImages(const TempDir& dir) {
  for (int i = 0; i < 12; ++i)
    WriteFile(dir / fmt::format("src/{}/{}.jpg", i % 3, i),
              Encode(256, 192, static_cast<unsigned>(i) + 1, TJPF_RGB, TJSAMP_420, 0));
}

LoaderOptions RandomCrops() {
  LoaderOptions options = ExactOptions();
  options.transform.kind = TransformOptions::Kind::kRandomResizedCrop;
  options.transform.flip_probability = 0.5f;
  options.transform.width = options.transform.height = 24;
  return options;
}

TEST(GpuDecodeSeekable, SendsTheDecoderOnlyTheIntervalsACropNeedsAndGivesTheSameBatch) {
  TempDir plain_dir, seekable_dir;
  WriteImages(plain_dir);
  WriteImages(seekable_dir);
  auto plain = PackSource(plain_dir);
  PackOptions p;
  p.seekable_jpeg = true;
  auto seekable = PackSource(seekable_dir, p);

  auto run = [&](std::shared_ptr<const Dataset> dataset, std::shared_ptr<FakeDecoderState> state,
                 LoaderStats* host = nullptr, const LoaderOptions& options = RandomCrops()) {
    testing::FakeDeviceRuntime fake;
    state->fake = &fake;
    DeviceLoaderOptions device = GpuDecode();
    device.device_buffers = 2;
    device.device_decode_bytes_per_sample = 256 << 10;  // room for every whole image: all decode on the "GPU"
    device.device_input_factor = 64;                    // and for the compressed bytes
    auto loader = device::CreateDeviceLoader(std::move(dataset), options, fake, 0, device, Opens(state));
    EXPECT_TRUE(loader.ok()) << loader.error().ToString();
    Epoch e = DrainDeviceEpoch(**loader);
    if (host != nullptr) *host = (*loader)->loader().stats();
    EXPECT_EQ((*loader)->stats().decode_no_room + (*loader)->stats().decode_cpu_after_error, 0u);
    return e;
  };
  auto whole = std::make_shared<FakeDecoderState>();
  const Epoch expected = run(plain, whole);
  auto regions = std::make_shared<FakeDecoderState>();
  LoaderStats host;
  const Epoch got = run(seekable, regions, &host);
  ASSERT_EQ(got.indices, expected.indices);
  // The crop's pixels decode as in the whole image (the region's margin),
  // and resample the same.
  EXPECT_LE(MaxFloatDifference(got, expected), 1e-5);
  // Most crops leave intervals out: fewer bytes and pixels decoded.
  EXPECT_GT(host.seekable_decodes, 0u);
  EXPECT_EQ(host.seekable_fallbacks, 0u);
  std::printf(
      "decoder input: %llu bytes and %llu pixels from the seekable pack, %llu and %llu whole (%llu crops "
      "as regions, counting batches prepared ahead)\n",
      static_cast<unsigned long long>(regions->jpeg_bytes), static_cast<unsigned long long>(regions->decoded_pixels),
      static_cast<unsigned long long>(whole->jpeg_bytes), static_cast<unsigned long long>(whole->decoded_pixels),
      static_cast<unsigned long long>(host.seekable_decodes));
  EXPECT_LT(regions->decoded_pixels, whole->decoded_pixels);
  EXPECT_LT(regions->jpeg_bytes, whole->jpeg_bytes);
  // The loader read those JPEGs in part (their heads and the crops' MCU rows): fewer bytes than read whole, for
  // the same batch and the same decoder input.
  EXPECT_GT(host.seekable_part_reads, host.samples / 2);
  EXPECT_EQ(host.seekable_part_rereads, 0u);
  LoaderOptions whole_reads = RandomCrops();
  whole_reads.read_crop_rows = false;
  auto regions_of_whole = std::make_shared<FakeDecoderState>();
  LoaderStats whole_host;
  const Epoch same = run(seekable, regions_of_whole, &whole_host, whole_reads);
  EXPECT_EQ(same.pixels, got.pixels);
  EXPECT_EQ(whole_host.seekable_part_reads, 0u);
  const auto per_sample = [](const LoaderStats& s) {
    return static_cast<double>(s.bytes_read) / static_cast<double>(s.samples_read);
  };
  EXPECT_LT(per_sample(host), 0.9 * per_sample(whole_host));
}

}  // namespace
}  // namespace stoker
