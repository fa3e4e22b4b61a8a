// SurveyImages and EstimateMaxSide (`stoker inspect --images`): sizes, coding
// and GPU routes read from the headers of an even spread of samples; what a
// max_side would re-encode; unreadable headers named.
#include <turbojpeg.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "pipeline/loader_test_util.h"
#include "stoker/open.h"
#include "stoker/pack.h"

namespace stoker {
namespace {

std::string Jpeg(int w, int h, int pixel_format, int sampling, bool progressive) {
  const int channels = pixel_format == TJPF_CMYK ? 4 : 3;
  std::vector<unsigned char> px(static_cast<std::size_t>(w) * h * channels, 128);
  for (std::size_t i = 0; i < px.size(); ++i) px[i] = static_cast<unsigned char>(i * 7);
  tjhandle tj = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(tj, px.data(), w, 0, h, pixel_format, &out, &size, sampling, 90,
                        progressive ? TJFLAG_PROGRESSIVE : 0),
            0)
      << tjGetErrorStr2(tj);
  std::string jpeg(reinterpret_cast<char*>(out), size);
  tjFree(out);
  tjDestroy(tj);
  return jpeg;
}

TEST(ImageSurvey, ReadsSizesCodingAndGpuRoutesFromTheHeaders) {
  TempDir dir;
  WriteFile(dir / "src/a/0.jpg", Jpeg(600, 400, TJPF_RGB, TJSAMP_420, false));
  WriteFile(dir / "src/a/1.jpg", Jpeg(300, 200, TJPF_RGB, TJSAMP_444, false));
  WriteFile(dir / "src/a/2.jpg", Jpeg(100, 800, TJPF_RGB, TJSAMP_420, true));
  WriteFile(dir / "src/b/3.jpg", Jpeg(64, 64, TJPF_CMYK, TJSAMP_444, false));
  WriteFile(dir / "src/b/4.jpg", "not a JPEG at all, though named like one");
  auto dataset = PackSource(dir);
  auto survey = SurveyImages(*dataset, 1000);
  ASSERT_TRUE(survey.ok()) << survey.error().ToString();
  EXPECT_EQ(survey->field, "jpg");
  EXPECT_EQ(survey->samples, 5u);
  EXPECT_EQ(survey->surveyed, 5u);
  ASSERT_EQ(survey->sizes.size(), 4u);
  EXPECT_EQ(survey->sizes[0].width, 600u);
  EXPECT_EQ(survey->sizes[0].height, 400u);
  EXPECT_EQ(survey->sizes[2].width, 100u);
  EXPECT_EQ(survey->sizes[2].height, 800u);
  EXPECT_EQ(survey->coding,
            (std::map<std::string, std::uint64_t>{{"baseline 4:2:0", 1},
                                                  {"baseline 4:4:4", 1},
                                                  {"progressive 4:2:0", 1},
                                                  {"baseline YCCK", 1}}));  // TurboJPEG writes CMYK as YCCK
  EXPECT_EQ(survey->route_hardware, 2u);
  EXPECT_EQ(survey->route_gpu, 1u);  // progressive: nvJPEG's GPU decoder, not the engines
  std::uint64_t on_cpu = 0;
  for (const auto& [reason, n] : survey->route_cpu) on_cpu += n;
  EXPECT_EQ(on_cpu, 1u);  // YCCK
  EXPECT_EQ(survey->unreadable, 1u);
  ASSERT_EQ(survey->unreadable_examples.size(), 1u);
  EXPECT_NE(survey->unreadable_examples[0].find("sample 'b/4' at "), std::string::npos)
      << survey->unreadable_examples[0];
  EXPECT_NE(survey->unreadable_examples[0].find(".tar:"), std::string::npos) << survey->unreadable_examples[0];

  // max_side 400 re-encodes the 600x400 (to 400x267) and the 100x800 (to 50x400).
  const MaxSideEffect at400 = EstimateMaxSide(*survey, 400);
  EXPECT_DOUBLE_EQ(at400.images_reencoded, 0.5);
  const double before = 600.0 * 400 + 300.0 * 200 + 100.0 * 800 + 64.0 * 64;
  const double after = 400.0 * 267 + 300.0 * 200 + 50.0 * 400 + 64.0 * 64;
  EXPECT_DOUBLE_EQ(at400.pixels_left, after / before);
  const MaxSideEffect at1024 = EstimateMaxSide(*survey, 1024);
  EXPECT_EQ(at1024.images_reencoded, 0.0);
  EXPECT_EQ(at1024.pixels_left, 1.0);
}

TEST(ImageSurvey, SpreadsItsSamplesOverTheDatasetAndNeedsAnImageField) {
  TempDir dir;
  for (int c = 0; c < 4; ++c)
    for (int i = 0; i < 5; ++i)
      WriteFile(dir / ("src/" + std::string(1, static_cast<char>('a' + c)) + "/" + std::to_string(i) + ".jpg"),
                Jpeg(40 + 8 * c, 32, TJPF_RGB, TJSAMP_420, false));
  auto dataset = PackSource(dir);
  auto survey = SurveyImages(*dataset, 4);
  ASSERT_TRUE(survey.ok()) << survey.error().ToString();
  EXPECT_EQ(survey->surveyed, 4u);
  ASSERT_EQ(survey->sizes.size(), 4u);
  // One from each class (packed class by class): widths 40, 48, 56, 64.
  for (int c = 0; c < 4; ++c) EXPECT_EQ(survey->sizes[static_cast<std::size_t>(c)].width, 40u + 8u * c);

  TempDir text;
  WriteFile(text / "rows.jsonl", "{\"path\": \"x.txt\", \"label\": 0}\n");
  WriteFile(text / "x.txt", "hello");
  auto packed = Pack(text / "rows.jsonl", text / "out", PackOptions{});
  ASSERT_TRUE(packed.ok()) << packed.error().ToString();
  auto opened = Dataset::Open(text / "out");
  ASSERT_TRUE(opened.ok());
  auto none = SurveyImages(**opened, 10);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.error().message().find("no jpg or jpeg field"), std::string::npos) << none.error().message();
}

}  // namespace
}  // namespace stoker
