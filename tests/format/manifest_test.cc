#include "format/manifest.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace stoker::manifest {
namespace {

TEST(Manifest, ParsesCsvWithQuotesAndExtras) {
  std::string csv =
      "path,label,caption\r\nimgs/a.jpg,cat,\"a cat, sitting\"\nimgs/b.jpg,dog,\"say \"\"hi\"\"\nthere\"\n\n";
  ASSERT_OK_AND_ASSIGN(auto rows, ParseCsv(csv, "m.csv"));
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].path, "imgs/a.jpg");
  EXPECT_EQ(rows[0].label, "cat");
  ASSERT_EQ(rows[0].extra.size(), 1u);
  EXPECT_EQ(rows[0].extra[0].first, "caption");
  EXPECT_EQ(rows[0].extra[0].second, "a cat, sitting");
  EXPECT_EQ(rows[1].extra[0].second, "say \"hi\"\nthere");
  EXPECT_EQ(rows[1].line, 3u);
}

TEST(Manifest, CsvErrorsNameTheLine) {
  auto r = ParseCsv("path,label\na.jpg,1\nb.jpg\n", "m.csv");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("m.csv:3: row has 1 columns"), std::string::npos) << r.error().message();
  EXPECT_FALSE(ParseCsv("file,label\na.jpg,1\n", "m.csv").ok());
  EXPECT_FALSE(ParseCsv("", "m.csv").ok());
  EXPECT_FALSE(ParseCsv("path\n\"unterminated\n", "m.csv").ok());
  EXPECT_FALSE(ParseCsv("path,path\na,b\n", "m.csv").ok());
}

TEST(Manifest, ParsesJsonLines) {
  std::string text =
      "{\"path\": \"a.jpg\", \"label\": 3, \"score\": 0.5}\n\n{\"path\": \"b.png\", \"label\": \"x\", \"note\": "
      "null}\n";
  ASSERT_OK_AND_ASSIGN(auto rows, ParseJsonLines(text, "m.jsonl"));
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].label, "3");
  ASSERT_EQ(rows[0].extra.size(), 1u);
  EXPECT_EQ(rows[0].extra[0].second, "0.5");
  EXPECT_EQ(rows[1].line, 3u);
  EXPECT_TRUE(rows[1].extra.empty());
  auto bad = ParseJsonLines("{\"path\": \"a.jpg\"}\n{oops\n", "m.jsonl");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("m.jsonl:2"), std::string::npos);
  EXPECT_FALSE(ParseJsonLines("{\"label\": 1}\n", "m.jsonl").ok());
  EXPECT_FALSE(ParseJsonLines("[1,2]\n", "m.jsonl").ok());
}

}  // namespace
}  // namespace stoker::manifest
