#include "codec/jpeg_restart.h"

#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codec/jpeg_internal.h"
#include "codec/jpeg_test_util.h"
#include "core/rng.h"

namespace stoker::codec {
namespace {

using testing_jpeg::Encode;
using testing_jpeg::EncodeSpec;
using testing_jpeg::Spec;

RestartOffsets View(const std::vector<std::uint32_t>& table) {
  return {reinterpret_cast<const std::byte*>(table.data()), static_cast<std::uint32_t>(table.size())};
}

DecodedRegion Whole(std::span<const std::byte> jpeg, int scale) {
  DecodedRegion out;
  EXPECT_TRUE(DecodeJpeg(jpeg, Roi{}, scale, out).ok());
  return out;
}

// Every pixel of `region` inside `roi` and at least `margin` (scaled) pixels
// from the region's edges that are not the image's equals the whole decode's.
void ExpectSamePixels(const DecodedRegion& whole, const DecodedRegion& region, Roi roi, int scale,
                      const std::string& what) {
  const int s = scale, margin = 16;
  ASSERT_EQ(region.scale, s) << what;
  const int ox = region.origin_x / s, oy = region.origin_y / s;
  const int x0 = std::max(roi.x / s, ox + (ox > 0 ? margin : 0));
  const int y0 = std::max(roi.y / s, oy + (oy > 0 ? margin : 0));
  const int x1 =
      std::min({(roi.x + roi.width) / s, ox + region.width - (ox + region.width < whole.width ? margin : 0)});
  const int y1 =
      std::min({(roi.y + roi.height) / s, oy + region.height - (oy + region.height < whole.height ? margin : 0)});
  ASSERT_LE(ox, roi.x / s) << what;
  ASSERT_LE(oy, roi.y / s) << what;
  ASSERT_GE(ox + region.width, std::min(whole.width, (roi.x + roi.width) / s)) << what;
  ASSERT_GE(oy + region.height, std::min(whole.height, (roi.y + roi.height) / s)) << what;
  for (int y = y0; y < y1; ++y)
    for (int x = x0; x < x1; ++x)
      for (int c = 0; c < 3; ++c) {
        const auto a = whole.pixels[(static_cast<std::size_t>(y) * whole.width + x) * 3 + c];
        const auto b = region.pixels[(static_cast<std::size_t>(y - oy) * region.width + (x - ox)) * 3 + c];
        ASSERT_EQ(a, b) << what << " at (" << x << ", " << y << ") channel " << c;
      }
}

// A box inside the image, each side at least `min_side` pixels.
Roi RandomBox(const EncodeSpec& spec, int min_side, Rng& rng) {
  Roi box;
  box.width = min_side + static_cast<int>(rng.Next() % static_cast<std::uint64_t>(spec.width - min_side + 1));
  box.height = min_side + static_cast<int>(rng.Next() % static_cast<std::uint64_t>(spec.height - min_side + 1));
  box.x = static_cast<int>(rng.Next() % static_cast<std::uint64_t>(spec.width - box.width + 1));
  box.y = static_cast<int>(rng.Next() % static_cast<std::uint64_t>(spec.height - box.height + 1));
  return box;
}

TEST(SeekableJpeg, TheRewriteDecodesToTheOriginalsPixelsAndItsTableIsFound) {
  const std::vector<EncodeSpec> specs = {
      Spec(517, 389),
      Spec(64, 48),
      Spec(1000, 40),
      Spec(333, 251, 3, 1, 1),
      Spec(333, 251, 3, 2, 1),
      Spec(301, 203, 1, 1, 1),
      Spec(16, 16),
      Spec(9, 700),
      Spec(700, 9),
      Spec(256, 256, 3, 1, 2),
  };
  for (const EncodeSpec& spec : specs) {
    const std::string what = std::to_string(spec.width) + "x" + std::to_string(spec.height) + " components " +
                             std::to_string(spec.components) + " sampling " + std::to_string(spec.h) + "x" +
                             std::to_string(spec.v);
    const std::vector<std::byte> original = Encode(spec);
    SeekableJpeg seekable = MakeSeekableJpeg(original);
    ASSERT_EQ(seekable.outcome, SeekableOutcome::kRewritten) << what << ": " << seekable.why;
    const DecodedRegion a = Whole(original, 1), b = Whole(seekable.bytes, 1);
    EXPECT_EQ(a.pixels, b.pixels) << what;
    auto layout = ReadScanLayout(seekable.bytes);
    ASSERT_TRUE(layout.ok()) << what << ": " << layout.status().ToString();
    EXPECT_GT(layout->restart_interval, 0u) << what;
    EXPECT_EQ(layout->mcus_per_row % layout->restart_interval, 0u) << what;
    const std::uint64_t intervals = layout->mcus_per_row / layout->restart_interval * std::uint64_t(layout->mcu_rows);
    ASSERT_EQ(seekable.table.size(), intervals + 1) << what;
    auto found = FindRestartTable(seekable.bytes);
    ASSERT_TRUE(found.ok()) << what;
    EXPECT_EQ(*found, seekable.table) << what;
    // Optimised Huffman tables pay for the markers on these images.
    EXPECT_LT(seekable.bytes.size(), original.size() + original.size() / 50 + 64) << what;
  }
}

TEST(SeekableJpeg, EveryRegionDecodesAsTheWholeFileDoesAtEveryScale) {
  const std::vector<EncodeSpec> specs = {Spec(517, 389), Spec(333, 251, 3, 1, 1), Spec(301, 203, 1, 1, 1),
                                         Spec(480, 360, 3, 2, 1)};
  Rng rng(42, 0);
  int used = 0;
  for (const EncodeSpec& spec : specs) {
    SeekableJpeg seekable = MakeSeekableJpeg(Encode(spec));
    ASSERT_EQ(seekable.outcome, SeekableOutcome::kRewritten) << seekable.why;
    for (int scale : {1, 2, 4, 8}) {
      const DecodedRegion whole = Whole(seekable.bytes, scale);
      std::vector<std::byte> stream;
      for (int trial = 0; trial < 40; ++trial) {
        const Roi roi = RandomBox(spec, 1, rng);
        DecodedRegion region;
        auto use = DecodeJpegSeekable(seekable.bytes, View(seekable.table), roi, scale, region, stream);
        const std::string what = std::to_string(spec.width) + "x" + std::to_string(spec.height) + " scale " +
                                 std::to_string(scale) + " roi " + std::to_string(roi.x) + "," + std::to_string(roi.y) +
                                 " " + std::to_string(roi.width) + "x" + std::to_string(roi.height);
        ASSERT_TRUE(use.ok()) << what << ": " << use.status().ToString();
        ASSERT_NE(*use, SeekUse::kDisagrees) << what;
        used += *use == SeekUse::kUsed;
        ExpectSamePixels(whole, region, roi, scale, what);
      }
    }
  }
  EXPECT_GT(used, 300);  // most random regions skip intervals
}

TEST(SeekableJpeg, AJpegWrittenWithRestartIntervalsElsewhereHasItsTableFoundForTheIndex) {
  EncodeSpec spec = Spec(640, 480);  // 40 MCUs to a row, 30 rows
  spec.restart_interval = 5;
  const std::vector<std::byte> jpeg = Encode(spec);
  const auto table = ExistingRestartTable(jpeg);
  ASSERT_TRUE(table.has_value());
  EXPECT_EQ(table->size(), 8u * 30 + 1);
  Rng rng(3, 0);
  const DecodedRegion whole = Whole(jpeg, 1);
  std::vector<std::byte> stream;
  for (int trial = 0; trial < 20; ++trial) {
    const Roi roi = RandomBox(spec, 16, rng);
    DecodedRegion region;
    auto use = DecodeJpegSeekable(jpeg, View(*table), roi, 1, region, stream);
    ASSERT_TRUE(use.ok()) << use.status().ToString();
    ASSERT_NE(*use, SeekUse::kDisagrees);
    ExpectSamePixels(whole, region, roi, 1, "trial " + std::to_string(trial));
  }
  spec.restart_interval = 1;  // an interval per MCU: 40 to a row, still indexed
  EXPECT_EQ(ExistingRestartTable(Encode(spec)).value_or(std::vector<std::uint32_t>{}).size(), 40u * 30 + 1);
  EncodeSpec wide = Spec(1280, 64);  // 80 MCUs to a row: an interval per MCU costs the index more than it saves
  wide.restart_interval = 1;
  EXPECT_FALSE(ExistingRestartTable(Encode(wide)).has_value());
  wide.restart_interval = 2;
  EXPECT_TRUE(ExistingRestartTable(Encode(wide)).has_value());
  spec.restart_interval = 3;  // does not divide the row: intervals do not tile the image
  EXPECT_FALSE(ExistingRestartTable(Encode(spec)).has_value());
  EXPECT_FALSE(ExistingRestartTable(Encode(Spec(640, 480))).has_value());  // no restart interval, as most JPEGs
  EncodeSpec progressive = Spec(640, 480);
  progressive.progressive = true;
  progressive.restart_interval = 5;
  EXPECT_FALSE(ExistingRestartTable(Encode(progressive)).has_value());
  const std::vector<std::byte> truncated(jpeg.begin(), jpeg.begin() + static_cast<std::ptrdiff_t>(jpeg.size() / 2));
  EXPECT_FALSE(ExistingRestartTable(truncated).has_value());
}

TEST(SeekableJpeg, AStreamOfTheRegionsIntervalsIsSmallerThanTheFile) {
  SeekableJpeg seekable = MakeSeekableJpeg(Encode(Spec(800, 600)));
  ASSERT_EQ(seekable.outcome, SeekableOutcome::kRewritten);
  std::vector<std::byte> stream;
  DecodedRegion region;
  auto use = DecodeJpegSeekable(seekable.bytes, View(seekable.table), Roi{400, 300, 200, 150}, 1, region, stream);
  ASSERT_TRUE(use.ok());
  EXPECT_EQ(*use, SeekUse::kUsed);
  // A quarter of the width and of the height, widened to whole intervals.
  EXPECT_LT(stream.size(), seekable.bytes.size() / 5);
  EXPECT_EQ(region.full.width, 800);
  EXPECT_EQ(region.full.height, 600);
}

TEST(SeekableJpeg, ARegionsStreamIsAJpegOfItsOwnForAnyDecoder) {
  // What the GPU path hands nvJPEG: decoded whole, as a file of its own, it
  // is the sub-image at the region's place (away from its inner edges).
  const EncodeSpec spec = Spec(480, 360);
  SeekableJpeg seekable = MakeSeekableJpeg(Encode(spec));
  ASSERT_EQ(seekable.outcome, SeekableOutcome::kRewritten);
  const DecodedRegion whole = Whole(seekable.bytes, 1);
  Rng rng(11, 0);
  int used = 0;
  std::vector<std::byte> stream;
  for (int i = 0; i < 40; ++i) {
    const Roi roi = RandomBox(spec, 24, rng);
    const SeekableRegion region = AssembleSeekableRegion(seekable.bytes, View(seekable.table), roi, stream);
    if (region.use != SeekUse::kUsed) continue;
    ++used;
    ASSERT_LE(region.x, roi.x);
    ASSERT_LE(region.y, roi.y);
    DecodedRegion alone;
    ASSERT_TRUE(DecodeJpeg(stream, Roi{}, 1, alone).ok());
    ASSERT_EQ(alone.width, region.width);
    ASSERT_EQ(alone.height, region.height);
    alone.origin_x = region.x;  // where it sits in the whole image
    alone.origin_y = region.y;
    ExpectSamePixels(whole, alone, roi, 1, "region " + std::to_string(i));
  }
  EXPECT_GT(used, 20);
  // A table that does not fit the file: nothing assembled, said so.
  std::vector<std::uint32_t> shifted = seekable.table;
  shifted[3] += 1;
  EXPECT_EQ(AssembleSeekableRegion(seekable.bytes, View(shifted), Roi{200, 150, 100, 100}, stream).use,
            SeekUse::kDisagrees);
}

// Read in part (the loader's read_crop_rows): the head and a run of MCU rows
// decode every region inside those rows exactly as the whole file does; a
// region reaching past them, or a damaged marker among them, decodes
// nothing and says so, for the caller to read the file whole.
TEST(SeekableJpeg, TheHeadAndARunOfRowsDecodeTheRegionsInsideThem) {
  const EncodeSpec spec = Spec(480, 360);  // 4:2:0: 16-px MCU rows, 23 of them
  SeekableJpeg seekable = MakeSeekableJpeg(Encode(spec));
  ASSERT_EQ(seekable.outcome, SeekableOutcome::kRewritten);
  auto layout = ReadScanLayout(seekable.bytes);
  ASSERT_TRUE(layout.ok());
  const std::uint32_t per_row = static_cast<std::uint32_t>(layout->mcus_per_row) / layout->restart_interval;
  const std::span<const std::byte> all(seekable.bytes);
  const auto& t = seekable.table;
  auto held = [&](std::uint32_t first_row, std::uint32_t end_row) {
    const std::uint64_t at = t[first_row * per_row];
    const std::uint64_t end =
        end_row == static_cast<std::uint32_t>(layout->mcu_rows) ? all.size() : t[end_row * per_row];
    return HeldJpeg(all.first(t[0]), all.subspan(at, end - at), at);
  };
  for (int scale : {1, 2}) {
    const DecodedRegion whole = Whole(seekable.bytes, scale);
    std::vector<std::byte> stream;
    Rng rng(5, static_cast<std::uint64_t>(scale));
    for (int trial = 0; trial < 30; ++trial) {
      const Roi roi = RandomBox(spec, 1, rng);
      const auto first = static_cast<std::uint32_t>(roi.y / 16);
      const auto end = static_cast<std::uint32_t>((roi.y + roi.height + 15) / 16);
      const std::string what =
          "scale " + std::to_string(scale) + " rows " + std::to_string(first) + "-" + std::to_string(end);
      DecodedRegion region;
      auto use = DecodeJpegSeekable(held(first, end), View(t), roi, scale, region, stream);
      ASSERT_TRUE(use.ok()) << what << ": " << use.status().ToString();
      ASSERT_EQ(*use, SeekUse::kUsed) << what;  // also at the top with every column: no whole file to decode
      ExpectSamePixels(whole, region, roi, scale, what);
      if (end - first >= 2) {  // a row short: nothing decoded
        EXPECT_EQ(*DecodeJpegSeekable(held(first, end - 1), View(t), roi, scale, region, stream), SeekUse::kNeedsWhole)
            << what;
        EXPECT_EQ(*DecodeJpegSeekable(held(first + 1, end), View(t), roi, scale, region, stream), SeekUse::kNeedsWhole)
            << what;
      }
    }
  }
  // A marker damaged among the rows held: the table disagrees, and nothing is decoded from a part.
  std::vector<std::byte> damaged = seekable.bytes;
  damaged[t[5 * per_row + 2] - 1] = std::byte{0xD0 + 7};  // an RSTn out of sequence
  const std::span<const std::byte> d(damaged);
  const std::uint64_t at = t[4 * per_row], end = t[8 * per_row];
  const HeldJpeg part(d.first(t[0]), d.subspan(at, end - at), at);
  std::vector<std::byte> stream;
  EXPECT_EQ(AssembleSeekableRegion(part, View(t), Roi{100, 70, 200, 50}, stream).use, SeekUse::kDisagrees);
  DecodedRegion region;
  EXPECT_EQ(*DecodeJpegSeekable(part, View(t), Roi{100, 70, 200, 50}, 1, region, stream), SeekUse::kNeedsWhole);
  // The same damage outside the rows held is not seen, and not used.
  const std::uint64_t at2 = t[10 * per_row], end2 = t[14 * per_row];
  const HeldJpeg other(d.first(t[0]), d.subspan(at2, end2 - at2), at2);
  EXPECT_EQ(AssembleSeekableRegion(other, View(t), Roi{100, 170, 200, 50}, stream).use, SeekUse::kUsed);
}

TEST(SeekableJpeg, TheWholeImageOrARegionAtTheTopLeftNeedsNoTable) {
  SeekableJpeg seekable = MakeSeekableJpeg(Encode(Spec(400, 300)));
  ASSERT_EQ(seekable.outcome, SeekableOutcome::kRewritten);
  std::vector<std::byte> stream;
  DecodedRegion region;
  auto use = DecodeJpegSeekable(seekable.bytes, View(seekable.table), Roi{}, 1, region, stream);
  ASSERT_TRUE(use.ok());
  EXPECT_EQ(*use, SeekUse::kNotUseful);
  use = DecodeJpegSeekable(seekable.bytes, View(seekable.table), Roi{0, 0, 400, 100}, 1, region, stream);
  ASSERT_TRUE(use.ok());
  EXPECT_EQ(*use, SeekUse::kNotUseful);
  use = DecodeJpegSeekable(seekable.bytes, {}, Roi{100, 100, 100, 100}, 1, region, stream);
  ASSERT_TRUE(use.ok());
  EXPECT_EQ(*use, SeekUse::kNotUseful);
}

TEST(SeekableJpeg, ATableThatDisagreesWithTheFileFallsBackToTheWholeFileWithTheSamePixels) {
  const std::vector<std::byte> original = Encode(Spec(517, 389));
  SeekableJpeg seekable = MakeSeekableJpeg(original);
  ASSERT_EQ(seekable.outcome, SeekableOutcome::kRewritten);
  const Roi roi{200, 150, 150, 120};
  const DecodedRegion whole = Whole(seekable.bytes, 1);
  const std::vector<std::uint32_t>& good = seekable.table;
  std::vector<std::vector<std::uint32_t>> bad;
  {
    auto t = good;  // one interval shifted by eight (the same RST number)
    t[20] = t[28];
    bad.push_back(t);
  }
  {
    auto t = good;
    t[10] += 1;
    bad.push_back(t);
  }
  {
    auto t = good;
    t.pop_back();
    bad.push_back(t);
  }
  {
    auto t = good;
    t.back() -= 2;
    bad.push_back(t);
  }
  {
    auto t = good;
    t[0] += 4;
    bad.push_back(t);
  }
  {
    auto t = good;
    t[5] = 0xFFFFFFF0u;
    bad.push_back(t);
  }
  bad.push_back(*FindRestartTable(MakeSeekableJpeg(Encode(Spec(517, 389), 99)).bytes));  // another image's table
  std::vector<std::byte> stream;
  for (std::size_t i = 0; i < bad.size(); ++i) {
    DecodedRegion region;
    auto use = DecodeJpegSeekable(seekable.bytes, View(bad[i]), roi, 1, region, stream);
    ASSERT_TRUE(use.ok()) << i;
    if (i + 1 == bad.size()) {
      // Another image of the same size and coder may share every offset only by chance: whatever it does, the
      // pixels are right or it fell back.
    } else {
      EXPECT_EQ(*use, SeekUse::kDisagrees) << i;
    }
    ExpectSamePixels(whole, region, roi, 1, "bad table " + std::to_string(i));
  }
  // A file whose data was edited (same size, one interval's bytes flipped) does not decode either way.
  std::vector<std::byte> edited = seekable.bytes;
  for (std::uint32_t k = good[40]; k < good[41] - 2; ++k) edited[k] = std::byte{0x55};
  DecodedRegion region;
  auto use = DecodeJpegSeekable(edited, View(good), Roi{0, 0, 517, 389}, 1, region, stream);
  EXPECT_FALSE(use.ok() && *use == SeekUse::kUsed);
}

TEST(SeekableJpeg, WhatCannotBeRewrittenIsKeptAndSaysWhy) {
  EncodeSpec progressive = Spec(300, 200);
  progressive.progressive = true;
  EXPECT_EQ(MakeSeekableJpeg(Encode(progressive)).outcome, SeekableOutcome::kProgressive);
  EncodeSpec arithmetic = Spec(300, 200);
  arithmetic.arithmetic = true;
  const auto arith = Encode(arithmetic);
  if (!arith.empty()) {
    EXPECT_EQ(MakeSeekableJpeg(arith).outcome, SeekableOutcome::kArithmetic);
  }
  std::vector<std::byte> truncated = Encode(Spec(300, 200));
  truncated.resize(truncated.size() / 2);
  SeekableJpeg t = MakeSeekableJpeg(truncated);
  EXPECT_EQ(t.outcome, SeekableOutcome::kUndecodable);
  EXPECT_FALSE(t.why.empty());
  EXPECT_TRUE(t.bytes.empty());
  const std::string png = "\x89PNG\r\n\x1a\n0000";
  std::vector<std::byte> png_bytes(png.size());
  std::memcpy(png_bytes.data(), png.data(), png.size());
  EXPECT_EQ(MakeSeekableJpeg(png_bytes).outcome, SeekableOutcome::kOther);
  EXPECT_EQ(MakeSeekableJpeg({}).outcome, SeekableOutcome::kUndecodable);
}

TEST(SeekableJpeg, MetadataMarkersAreKept) {
  EncodeSpec spec = Spec(200, 100);
  static constexpr char kExif[] = "Exif\0\0MM\0*\0\0\0\x08orientation-and-more";
  spec.app1 = std::string(kExif, sizeof(kExif) - 1);
  spec.comment = "a comment that must survive";
  SeekableJpeg seekable = MakeSeekableJpeg(Encode(spec));
  ASSERT_EQ(seekable.outcome, SeekableOutcome::kRewritten);
  const std::string bytes(reinterpret_cast<const char*>(seekable.bytes.data()), seekable.bytes.size());
  EXPECT_NE(bytes.find(spec.app1), std::string::npos);
  EXPECT_NE(bytes.find(spec.comment), std::string::npos);
  EXPECT_EQ(bytes.find("JFIF"), bytes.rfind("JFIF"));  // one JFIF header, not two
}

TEST(SeekableJpeg, TheRestartIntervalDividesTheRowIntoAboutSixteen) {
  EXPECT_EQ(ChooseRestartInterval(32, 16), 2);    // 500 px at 4:2:0: 16 intervals of 32 px
  EXPECT_EQ(ChooseRestartInterval(250, 16), 25);  // 4000 px: 10 of 400 px
  EXPECT_EQ(ChooseRestartInterval(31, 16), 31);   // a prime count: whole rows
  EXPECT_EQ(ChooseRestartInterval(2, 16), 2);     // small images: whole rows
  EXPECT_EQ(ChooseRestartInterval(63, 8), 7);     // grey: 9 of 56 px
  EXPECT_EQ(ChooseRestartInterval(1, 16), 1);
}

TEST(SeekableJpeg, ScanLayoutRefusesWhatItCannotSeek) {
  EncodeSpec progressive = Spec(64, 64);
  progressive.progressive = true;
  EXPECT_FALSE(ReadScanLayout(Encode(progressive)).ok());
  EXPECT_FALSE(FindRestartTable(Encode(Spec(64, 64))).ok());  // no restart interval
  const std::vector<std::byte> nothing(3);
  EXPECT_FALSE(ReadScanLayout(nothing).ok());
}

}  // namespace
}  // namespace stoker::codec

namespace stoker::codec {
namespace {

// What the loader relies on: a region decoded with a margin of 4 * scale
// pixels around a box holds the whole decode's pixels over the box and one
// scaled pixel around it (the resampler's reach), with or without a table.
TEST(SeekableJpeg, AMarginOfFourScaledPixelsKeepsTheBoxExact) {
  const std::vector<EncodeSpec> specs = {Spec(517, 389), Spec(333, 251, 3, 1, 1), Spec(301, 203, 1, 1, 1),
                                         Spec(480, 360, 3, 2, 1), Spec(290, 410, 3, 1, 2)};
  Rng rng(5, 0);
  for (const EncodeSpec& spec : specs) {
    SeekableJpeg seekable = MakeSeekableJpeg(Encode(spec));
    ASSERT_EQ(seekable.outcome, SeekableOutcome::kRewritten) << seekable.why;
    for (int scale : {1, 2, 4, 8}) {
      const DecodedRegion whole = Whole(seekable.bytes, scale);
      std::vector<std::byte> stream;
      for (int trial = 0; trial < 30; ++trial) {
        const Roi box = RandomBox(spec, 8, rng);
        const int m = 4 * scale;
        const int left = std::max(0, box.x - m), top = std::max(0, box.y - m);
        const int right = std::min(spec.width, box.x + box.width + m);
        const int bottom = std::min(spec.height, box.y + box.height + m);
        const Roi roi{left, top, right - left, bottom - top};
        // The box in scaled pixels, one more around it, inside the image.
        const int x0 = std::max(0, box.x / scale - 1), y0 = std::max(0, box.y / scale - 1);
        const int x1 = std::min(whole.width, (box.x + box.width + scale - 1) / scale + 1);
        const int y1 = std::min(whole.height, (box.y + box.height + scale - 1) / scale + 1);
        for (bool with_table : {false, true}) {
          DecodedRegion region;
          if (with_table) {
            ASSERT_TRUE(DecodeJpegSeekable(seekable.bytes, View(seekable.table), roi, scale, region, stream).ok());
          } else {
            ASSERT_TRUE(DecodeJpeg(seekable.bytes, roi, scale, region).ok());
          }
          const int ox = region.origin_x / scale, oy = region.origin_y / scale;
          ASSERT_LE(ox, x0);
          ASSERT_LE(oy, y0);
          ASSERT_GE(ox + region.width, x1);
          ASSERT_GE(oy + region.height, y1);
          for (int y = y0; y < y1; ++y)
            for (int x = x0; x < x1; ++x)
              for (int c = 0; c < 3; ++c)
                ASSERT_EQ(whole.pixels[(static_cast<std::size_t>(y) * whole.width + x) * 3 + c],
                          region.pixels[(static_cast<std::size_t>(y - oy) * region.width + (x - ox)) * 3 + c])
                    << spec.width << "x" << spec.height << " components " << spec.components << " sampling " << spec.h
                    << "x" << spec.v << " scale " << scale << (with_table ? " table" : " plain") << " at (" << x << ", "
                    << y << ")";
        }
      }
    }
  }
}

}  // namespace
}  // namespace stoker::codec
