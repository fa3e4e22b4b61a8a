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
  ASSERT_EQ(rows[0].files.size(), 1u);
  EXPECT_EQ(rows[0].files[0].column, "path");
  EXPECT_EQ(rows[0].files[0].path, "imgs/a.jpg");
  EXPECT_EQ(rows[0].label, "cat");
  ASSERT_EQ(rows[0].extra.size(), 1u);
  EXPECT_EQ(rows[0].extra[0].column, "caption");
  EXPECT_EQ(rows[0].extra[0].text, "a cat, sitting");
  EXPECT_EQ(rows[0].extra[0].type, ValueType::kString);
  EXPECT_EQ(rows[1].extra[0].text, "say \"hi\"\nthere");
  EXPECT_EQ(rows[1].line, 3u);
}

TEST(Manifest, CsvErrorsNameTheLine) {
  auto r = ParseCsv("path,label\na.jpg,1\nb.jpg\n", "m.csv");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("m.csv:3: row has 1 column, the header has"), std::string::npos)
      << r.error().message();
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
  EXPECT_EQ(rows[0].extra[0], (Value{"score", "0.5", ValueType::kNumber}));
  EXPECT_EQ(rows[1].line, 3u);
  EXPECT_TRUE(rows[1].extra.empty());
  auto bad = ParseJsonLines("{\"path\": \"a.jpg\"}\n{oops\n", "m.jsonl");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("m.jsonl:2"), std::string::npos);
  EXPECT_FALSE(ParseJsonLines("{\"label\": 1}\n", "m.jsonl").ok());
  EXPECT_FALSE(ParseJsonLines("[1,2]\n", "m.jsonl").ok());
}

TEST(Manifest, CsvFileColumnsAndTypedCells) {
  const std::string csv =
      "path,mask,label,n,score,word\n"
      "a.jpg,a.png,1,7,0.5,x\n"
      "b.jpg,,2,-3,1e3,\n"
      "c.jpg,c.png,3,99999999999999999999,nan,12a\n";
  const std::vector<std::string> file_columns = {"mask"};
  ASSERT_OK_AND_ASSIGN(auto rows, ParseCsv(csv, "m.csv", file_columns));
  ASSERT_EQ(rows.size(), 3u);
  ASSERT_EQ(rows[0].files.size(), 2u);
  EXPECT_EQ(rows[0].files[0].column, "path");
  EXPECT_EQ(rows[0].files[1].column, "mask");
  EXPECT_EQ(rows[0].files[1].path, "a.png");
  ASSERT_EQ(rows[1].files.size(), 1u) << "an empty file cell: the row has no such file";
  EXPECT_EQ(rows[0].extra, (std::vector<Value>{{"n", "7", ValueType::kInteger},
                                               {"score", "0.5", ValueType::kNumber},
                                               {"word", "x", ValueType::kString}}));
  // Empty cells are left out; "1e3" is a number; too large for int64 is a number; "nan" and "12a" are text.
  EXPECT_EQ(rows[1].extra,
            (std::vector<Value>{{"n", "-3", ValueType::kInteger}, {"score", "1e3", ValueType::kNumber}}));
  EXPECT_EQ(rows[2].extra, (std::vector<Value>{{"n", "99999999999999999999", ValueType::kNumber},
                                               {"score", "nan", ValueType::kString},
                                               {"word", "12a", ValueType::kString}}));

  // Without `path`, the file columns carry the files; a row with none is refused, naming its line.
  const std::vector<std::string> two = {"image", "mask"};
  ASSERT_OK_AND_ASSIGN(auto no_path, ParseCsv("mask,image\nm.png,i.jpg\n", "m.csv", two));
  ASSERT_EQ(no_path[0].files.size(), 2u);
  EXPECT_EQ(no_path[0].files[0].column, "image") << "file columns keep the order they were given in";
  auto empty_row = ParseCsv("image,mask\n,\n", "m.csv", two);
  ASSERT_FALSE(empty_row.ok());
  EXPECT_NE(empty_row.error().message().find("m.csv:2: no file"), std::string::npos) << empty_row.error().message();
  auto missing = ParseCsv("path,label\na.jpg,1\n", "m.csv", file_columns);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message().find("file column 'mask' is not in the header"), std::string::npos);
  for (const char* bad : {"label", "key", "path", "Mask", "a.b", ""}) {
    const std::vector<std::string> columns = {bad};
    EXPECT_FALSE(ParseCsv("path\na.jpg\n", "m.csv", columns).ok()) << bad;
  }
}

TEST(Manifest, JsonLinesFileColumnsAndTypes) {
  const std::string text =
      "{\"path\": \"a.jpg\", \"mask\": \"a.png\", \"boxes\": [[1, 2, 3, 4]], \"n\": 2, \"ok\": true, \"cap\": \"hi\"}\n"
      "{\"path\": \"b.jpg\", \"mask\": null}\n";
  const std::vector<std::string> file_columns = {"mask"};
  ASSERT_OK_AND_ASSIGN(auto rows, ParseJsonLines(text, "m.jsonl", file_columns));
  ASSERT_EQ(rows[0].files.size(), 2u);
  EXPECT_EQ(rows[0].files[1].path, "a.png");
  EXPECT_EQ(rows[0].extra, (std::vector<Value>{{"boxes", "[[1,2,3,4]]", ValueType::kJson},
                                               {"cap", "hi", ValueType::kString},
                                               {"n", "2", ValueType::kInteger},
                                               {"ok", "true", ValueType::kJson}}));
  EXPECT_EQ(rows[1].files.size(), 1u);
  auto not_string = ParseJsonLines("{\"path\": \"a.jpg\", \"mask\": 3}\n", "m.jsonl", file_columns);
  ASSERT_FALSE(not_string.ok());
  EXPECT_NE(not_string.error().message().find("m.jsonl:1: 'mask' must be a string"), std::string::npos);
}

}  // namespace
}  // namespace stoker::manifest
