// CheckFieldsDecode: every field through the loader's decoders, each
// failure named by sample, field and shard:offset.
#include "stoker/field_check.h"

#include <gtest/gtest.h>

#include "pipeline/loader_test_util.h"
#include "stoker/pack.h"

namespace stoker {
namespace {

TEST(FieldCheck, NamesEachFieldThatDoesNotDecode) {
  TempDir dir;
  std::string csv = "path,extra,meta,count\n";
  for (int i = 0; i < 150; ++i) {
    const std::string n = std::to_string(i);
    // Sample 7's image is text; sample 90's JSON is cut short; sample 120's number is not one.
    WriteFile(dir / ("m/" + n + ".jpg"), i == 7 ? std::string("not a picture") : MakeJpeg(24, 16, i));
    WriteFile(dir / ("m/" + n + ".bin"), "anything");
    WriteFile(dir / ("m/" + n + ".json"), i == 90 ? std::string("{\"a\": ") : "{\"i\": " + n + "}");
    WriteFile(dir / ("m/" + n + ".id"), i == 120 ? std::string("x12") : n);
    csv += n + ".jpg," + n + ".bin," + n + ".json," + n + ".id\n";
  }
  WriteFile(dir / "m/list.csv", csv);
  PackOptions pack;
  pack.file_columns = {"extra", "meta", "count"};
  pack.keep_bad_images = true;  // sample 7's image, for the check to name
  ASSERT_OK(Pack(dir / "m/list.csv", dir / "out", pack).status());
  ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(dir / "out"));

  DecodeCheckOptions options;
  options.threads = 3;
  std::uint64_t last_done = 0;
  options.on_progress = [&](std::uint64_t done, std::uint64_t total) {
    EXPECT_EQ(total, 150u);
    last_done = done;
  };
  ASSERT_OK_AND_ASSIGN(DecodeCheckReport report, CheckFieldsDecode(*dataset, options));
  EXPECT_EQ(last_done, 150u);
  EXPECT_EQ(report.samples_checked, 150u);
  EXPECT_EQ(report.fields_not_decodable, 150u) << "extra.bin is bytes: nothing to decode";
  EXPECT_EQ(report.fields_decoded, 150u * 3 - 3);
  ASSERT_EQ(report.problems.size(), 3u);
  const char* expected[][2] = {{"7", "field 'jpg' (image) does not decode"},
                               {"90", "field 'meta.json' (json) does not decode: not valid JSON"},
                               {"120", "field 'count.id' (int) does not decode: 'x12' is not an integer"}};
  for (int p = 0; p < 3; ++p) {
    EXPECT_EQ(report.problems[p].key, expected[p][0]);
    EXPECT_TRUE(report.problems[p].where.starts_with("shard-000000.tar:")) << report.problems[p].where;
    EXPECT_NE(report.problems[p].message.find(expected[p][1]), std::string::npos) << report.problems[p].message;
  }
}

}  // namespace
}  // namespace stoker
