#include "codec/jpeg_huffman.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codec/jpeg_restart.h"
#include "codec/jpeg_test_util.h"
#include "core/rng.h"

namespace stoker::codec {
namespace {

using jpeg_internal::DecodeJpegUsing;
using testing_jpeg::Encode;
using testing_jpeg::EncodeSpec;
using testing_jpeg::Spec;

struct Outcome {
  bool ok = false;
  bool fast = false;  // the fast decoder decoded it
  DecodedRegion region;
};

Outcome Decode(std::span<const std::byte> jpeg, Roi roi, int scale, bool fast_huffman) {
  Outcome o;
  o.ok = DecodeJpegUsing(jpeg, roi, scale, o.region, fast_huffman, &o.fast).ok();
  return o;
}

// The fast decoder's result is libjpeg's: both fail, or both give the same
// region and pixels. Returns whether the fast decoder decoded it.
bool ExpectAsLibjpeg(std::span<const std::byte> jpeg, Roi roi, int scale, const std::string& what) {
  const Outcome fast = Decode(jpeg, roi, scale, true);
  const Outcome plain = Decode(jpeg, roi, scale, false);
  EXPECT_EQ(fast.ok, plain.ok) << what;
  EXPECT_FALSE(plain.fast) << what;
  if (fast.ok && plain.ok) {
    EXPECT_EQ(fast.region.width, plain.region.width) << what;
    EXPECT_EQ(fast.region.height, plain.region.height) << what;
    EXPECT_EQ(fast.region.origin_x, plain.region.origin_x) << what;
    EXPECT_EQ(fast.region.origin_y, plain.region.origin_y) << what;
    EXPECT_TRUE(fast.region.pixels == plain.region.pixels) << what << ": the pixels differ";
  }
  return fast.ok && fast.fast;
}

TEST(FastHuffman, DecodesEveryLayoutRegionAndScaleAsLibjpegDoes) {
  struct Layout {
    const char* name;
    EncodeSpec spec;
  };
  std::vector<Layout> layouts = {{"4:2:0", Spec(250, 130)},        {"4:2:2", Spec(97, 61, 3, 2, 1)},
                                 {"4:4:4", Spec(64, 64, 3, 1, 1)}, {"4:4:0", Spec(45, 80, 3, 1, 2)},
                                 {"grey", Spec(120, 33, 1)},       {"one pixel", Spec(1, 1)},
                                 {"4:1:1", Spec(131, 20, 3, 4, 1)}};
  int fast_decodes = 0, cases = 0;
  for (const Layout& layout : layouts)
    for (int restart : {0, 1, 3, 7})
      for (bool optimize : {false, true}) {
        EncodeSpec spec = layout.spec;
        spec.restart_interval = restart;
        spec.optimize = optimize;
        const std::vector<std::byte> jpeg = Encode(spec, static_cast<std::uint64_t>(restart * 2 + optimize));
        ASSERT_FALSE(jpeg.empty());
        const int w = spec.width, h = spec.height;
        const std::vector<Roi> rois = {Roi{}, Roi{w / 3, h / 3, std::max(1, w / 2), std::max(1, h / 2)},
                                       Roi{0, h - 1, w, 1}};
        for (const Roi& roi : rois)
          for (int scale : {1, 2, 8}) {
            const std::string what = fmt::format("{} restart {} optimize {} roi {},{} {}x{} scale {}", layout.name,
                                                 restart, optimize, roi.x, roi.y, roi.width, roi.height, scale);
            fast_decodes += ExpectAsLibjpeg(jpeg, roi, scale, what);
            ++cases;
          }
      }
  EXPECT_EQ(fast_decodes, cases);  // every one of these is sequential Huffman: the fast decoder took them all
}

TEST(FastHuffman, LeavesProgressiveAndArithmeticScansToLibjpeg) {
  EncodeSpec progressive = Spec(90, 70);
  progressive.progressive = true;
  EncodeSpec arithmetic = Spec(90, 70);
  arithmetic.arithmetic = true;
  for (const EncodeSpec& spec : {progressive, arithmetic}) {
    const std::vector<std::byte> jpeg = Encode(spec);
    const Outcome fast = Decode(jpeg, Roi{}, 1, true);
    ASSERT_TRUE(fast.ok);
    EXPECT_FALSE(fast.fast);
    EXPECT_FALSE(ExpectAsLibjpeg(jpeg, Roi{}, 1, "not sequential Huffman"));
  }
}

TEST(FastHuffman, ASeekableJpegsIntervalStreamDecodesAsLibjpegDoes) {
  const std::vector<std::byte> original = Encode(Spec(400, 260));
  const SeekableJpeg seekable = MakeSeekableJpeg(original);
  ASSERT_EQ(seekable.outcome, SeekableOutcome::kRewritten);
  const RestartOffsets table{reinterpret_cast<const std::byte*>(seekable.table.data()),
                             static_cast<std::uint32_t>(seekable.table.size())};
  std::vector<std::byte> stream;
  const SeekableRegion region = AssembleSeekableRegion(seekable.bytes, table, Roi{150, 90, 120, 100}, stream);
  ASSERT_EQ(region.use, SeekUse::kUsed);
  EXPECT_TRUE(ExpectAsLibjpeg(stream, Roi{}, 1, "an assembled region"));
  EXPECT_TRUE(ExpectAsLibjpeg(seekable.bytes, Roi{}, 1, "the seekable JPEG whole"));
}

// Damage of every kind a shard can hold: the fast decoder decodes exactly
// what libjpeg decodes and fails where libjpeg fails (it hands libjpeg what
// it does not take).
TEST(FastHuffman, DamagedDataDecodesOrFailsExactlyAsLibjpeg) {
  std::vector<std::vector<std::byte>> jpegs;
  for (int restart : {0, 2}) {
    EncodeSpec spec = Spec(96, 80);
    spec.restart_interval = restart;
    spec.optimize = restart == 0;
    jpegs.push_back(Encode(spec, 11));
  }
  Rng rng(2026, 12);
  int fast_ok = 0, both_failed = 0, trials = 0;
  for (const std::vector<std::byte>& good : jpegs) {
    auto scan = ReadScanLayout(good);
    ASSERT_TRUE(scan.ok());
    const std::size_t data_at = scan->data_at, data_end = good.size() - 2;  // before EOI
    for (int t = 0; t < 400; ++t) {
      std::vector<std::byte> bad = good;
      const std::size_t at = data_at + rng.Next() % (data_end - data_at);
      std::string kind;
      switch (t % 8) {
        case 0:
          kind = "a byte changed";
          bad[at] = static_cast<std::byte>(rng.Next() % 256);
          break;
        case 1:
          kind = "a bit flipped";
          bad[at] ^= static_cast<std::byte>(1u << (rng.Next() % 8));
          break;
        case 2:
          kind = "cut short";
          bad.resize(at);
          break;
        case 3:
          kind = "a byte dropped";
          bad.erase(bad.begin() + static_cast<std::ptrdiff_t>(at));
          break;
        case 4:
          kind = "a byte inserted";
          bad.insert(bad.begin() + static_cast<std::ptrdiff_t>(at), static_cast<std::byte>(rng.Next() % 256));
          break;
        case 5:
          kind = "a marker inserted";
          bad.insert(bad.begin() + static_cast<std::ptrdiff_t>(at),
                     {std::byte{0xFF}, static_cast<std::byte>(0xD0 + rng.Next() % 10)});
          break;
        case 6:
          kind = "a fill byte inserted";
          bad.insert(bad.begin() + static_cast<std::ptrdiff_t>(at), std::byte{0xFF});
          break;
        default:
          kind = "cut short, EOI kept";
          bad.erase(bad.begin() + static_cast<std::ptrdiff_t>(at), bad.end() - 2);
          break;
      }
      const std::string what = fmt::format("{} at byte {} (trial {})", kind, at, t);
      const Roi roi = t % 3 == 0 ? Roi{20, 30, 40, 20} : Roi{};
      const bool fast = ExpectAsLibjpeg(bad, roi, 1, what);
      fast_ok += fast;
      both_failed += !Decode(bad, roi, 1, false).ok;
      ++trials;
    }
  }
  // The damage was real and both paths were exercised.
  EXPECT_GT(fast_ok, trials / 20);
  EXPECT_GT(both_failed, trials / 5);
}

// A file cut anywhere (no EOI left): a crop of the top rows can be whole
// while libjpeg's read-ahead meets the end of the data, which it reports
// as a premature end; the result is libjpeg's at every cut.
TEST(FastHuffman, AFileCutAtAnyByteDecodesOrFailsAsLibjpeg) {
  for (int restart : {0, 2}) {
    EncodeSpec spec = Spec(64, 64);
    spec.restart_interval = restart;
    const std::vector<std::byte> good = Encode(spec, 5);
    auto scan = ReadScanLayout(good);
    ASSERT_TRUE(scan.ok());
    int top_ok = 0;
    for (std::size_t cut = scan->data_at; cut < good.size(); ++cut) {
      const std::span<const std::byte> bytes(good.data(), cut);
      for (const Roi& roi : {Roi{0, 0, 64, 8}, Roi{}})
        ExpectAsLibjpeg(bytes, roi, 1, fmt::format("restart {}: cut at {} of {}", restart, cut, good.size()));
      top_ok += Decode(bytes, Roi{0, 0, 64, 8}, 1, false).ok;
    }
    EXPECT_GT(top_ok, 0);  // some cuts leave the top rows decodable
  }
}

// The differential fuzzer's findings (fuzz/corpus/jpeg_huffman/regression_*,
// each a mode byte choosing region and scale, then the JPEG) decode as
// libjpeg decodes them. regression_last_interval_open: cut after its last
// restart interval's data, with restart markers before it but none after,
// so libjpeg's read-ahead met the end of the data ("Premature end of JPEG
// file") where the fast decoder needed no more bits and had decoded it.
TEST(FastHuffman, TheFuzzersFindingsDecodeAsLibjpeg) {
  const std::filesystem::path corpus = std::filesystem::path(STOKER_SOURCE_DIR) / "fuzz/corpus/jpeg_huffman";
  int seeds = 0;
  for (const auto& entry : std::filesystem::directory_iterator(corpus)) {
    if (entry.path().filename().string().rfind("regression_", 0) != 0) continue;
    std::ifstream file(entry.path(), std::ios::binary);
    const std::vector<char> data((std::istreambuf_iterator<char>(file)), {});
    ASSERT_GE(data.size(), 2u) << entry.path();
    const auto mode = static_cast<std::uint8_t>(data[0]);
    const std::span<const std::byte> jpeg(reinterpret_cast<const std::byte*>(data.data() + 1), data.size() - 1);
    Roi roi;
    if (mode & 4) roi = {(mode >> 3 & 3) * 8, (mode >> 5) * 5, 24, 17};
    ExpectAsLibjpeg(jpeg, roi, 1 << (mode & 3), entry.path().filename().string());
    ++seeds;
  }
  EXPECT_GE(seeds, 2);
}

// A stream whose restart markers come with fill bytes (0xFF repeated before
// the marker, which JPEG allows) decodes as libjpeg decodes it.
TEST(FastHuffman, FillBytesBeforeARestartMarkerAreSkipped) {
  EncodeSpec spec = Spec(64, 48);
  spec.restart_interval = 1;
  const std::vector<std::byte> good = Encode(spec);
  auto table = FindRestartTable(good);
  ASSERT_TRUE(table.ok());
  ASSERT_GT(table->size(), 3u);
  std::vector<std::byte> filled = good;
  const std::size_t marker = (*table)[2] - 2;  // the RST before interval 2
  ASSERT_EQ(filled[marker], std::byte{0xFF});
  filled.insert(filled.begin() + static_cast<std::ptrdiff_t>(marker), {std::byte{0xFF}, std::byte{0xFF}});
  EXPECT_TRUE(ExpectAsLibjpeg(filled, Roi{}, 1, "fill bytes"));
  const Outcome a = Decode(filled, Roi{}, 1, true), b = Decode(good, Roi{}, 1, true);
  EXPECT_TRUE(a.region.pixels == b.region.pixels);
}

}  // namespace
}  // namespace stoker::codec
