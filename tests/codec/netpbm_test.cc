// Binary PGM/PPM: the header as Netpbm writes it (comments, any whitespace),
// samples scaled as Pillow's PpmDecoder scales them (ties to even), and the
// forms and damage refused by name.
#include "codec/netpbm.h"

#include <cstring>

#include <gtest/gtest.h>

#include "codec/image_decode.h"
#include "test_util.h"

namespace stoker::codec {
namespace {

using testing::Bytes;

TEST(Netpbm, DecodesTheHeaderAndScalesSamplesAsPillowDoes) {
  SourceImage out;
  // maxval 6: 1 -> 42.5 -> 42 and 3 -> 127.5 -> 128 (ties to even, as Python's round); 9 is clipped to 6.
  const std::string pgm = std::string("P5\n# made by hand\n4 # width\n1\n6\t") + std::string{0, 1, 3, 9};
  ASSERT_OK(DecodeNetpbm(Bytes(pgm), 0, &out));
  EXPECT_EQ(out.mode, SourceMode::kGray);
  EXPECT_EQ(out.width, 4);
  EXPECT_EQ(out.height, 1);
  EXPECT_EQ(out.data, (std::vector<std::uint8_t>{0, 42, 128, 255}));
  EXPECT_EQ(DetectImageFormat(Bytes(pgm)), ImageFormat::kNetpbm);
  ASSERT_OK_AND_ASSIGN(auto size, ImageFileSize(Bytes(pgm)));
  EXPECT_EQ(size.width, 4);
  // 16-bit gray is Pillow's "I": big-endian samples, kept at 0..65535 (maxval 65535: as they are).
  const std::string wide = std::string("P5 2 1 65535\n") + std::string{'\x12', '\x34', '\xff', '\xfe'};
  ASSERT_OK(DecodeNetpbm(Bytes(wide), 0, &out));
  EXPECT_EQ(out.mode, SourceMode::kGray16);
  std::uint16_t samples[2];
  std::memcpy(samples, out.data.data(), 4);
  EXPECT_EQ(samples[0], 0x1234);
  EXPECT_EQ(samples[1], 0xfffe);
  // 16-bit colour is scaled to 8 bits: 500 of 1000 -> 127.5 -> 128.
  const std::string ppm = std::string("P6 1 1 1000\n") + std::string{'\x01', '\xf4', '\x03', '\xe8', '\x00', '\x00'};
  ASSERT_OK(DecodeNetpbm(Bytes(ppm), 0, &out));
  EXPECT_EQ(out.mode, SourceMode::kRGB);
  EXPECT_EQ(out.data, (std::vector<std::uint8_t>{128, 255, 0}));
}

TEST(Netpbm, RefusesOtherFormsAndDamageNamingThem) {
  SourceImage out;
  const auto refused = [&](const std::string& data, StatusCode code, std::string_view says) {
    Status s = DecodeNetpbm(Bytes(data), 0, &out);
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(says), std::string::npos) << s.message();
  };
  refused("P2\n1 1\n255\n7\n", StatusCode::kUnimplemented, "P2 image (a plain-text form)");
  refused("P4\n8 1\nU", StatusCode::kUnimplemented, "binary PBM bitmap");
  refused("P6 2 2 255\n" + std::string(11, 'x'), StatusCode::kCorruption, "needs 12 raster bytes, 11 are there");
  refused("P5 0 2 255\n", StatusCode::kCorruption, "0x2 pixels");
  refused("P5 2 2 0\n" + std::string(4, 'x'), StatusCode::kCorruption, "maxval 0");
  refused("P5 2 2 255", StatusCode::kCorruption, "no whitespace after maxval");
  refused("P5 99999999999 2 255\n", StatusCode::kCorruption, "too large");
  Status s = DecodeNetpbm(Bytes("P5 100 100 255\n" + std::string(10000, 'x')), 9999, &out);
  EXPECT_NE(s.message().find("over the limit of 9999"), std::string::npos) << s.message();
}

// Pack names an image whose file or column says nothing of its format by
// what its bytes are: every format the decoders take gets its extension.
TEST(ImageFieldExtension, NamesEveryFormatTheDecodersTakeAndNothingElse) {
  EXPECT_EQ(ImageFieldExtension(stoker::testing::Bytes(testing::FakeImage("jpg", 64, 1))), "jpg");
  EXPECT_EQ(ImageFieldExtension(stoker::testing::Bytes(testing::FakeImage("png", 64, 1))), "png");
  EXPECT_EQ(ImageFieldExtension(stoker::testing::Bytes(std::string("RIFF\x10\0\0\0WEBPVP8 ", 16))), "webp");
  EXPECT_EQ(ImageFieldExtension(stoker::testing::Bytes(std::string("II*\0\x08\0\0\0", 8))), "tif");
  EXPECT_EQ(ImageFieldExtension(stoker::testing::Bytes(std::string("MM\0+\0\x08\0\0", 8))), "tif");  // BigTIFF
  EXPECT_EQ(ImageFieldExtension(stoker::testing::Bytes("P5 1 1 255\n\x07")), "pgm");
  EXPECT_EQ(ImageFieldExtension(stoker::testing::Bytes("P6 1 1 255\n\x07\x07\x07")), "ppm");
  EXPECT_EQ(ImageFieldExtension(stoker::testing::Bytes(std::string("BM\x3a\0\0\0\0\0\0\0\x36\0\0\0\x28\0", 16))),
            "bmp");
  for (const std::string& other : {std::string(), std::string("<html>403</html>"), std::string("GIF89a\1\0\1\0"),
                                   std::string("P2\n1 1\n255\n7\n"), std::string("\xff\xd8", 2)})
    EXPECT_EQ(ImageFieldExtension(stoker::testing::Bytes(other)), "") << other;
}

}  // namespace
}  // namespace stoker::codec
