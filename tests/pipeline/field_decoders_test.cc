#include "pipeline/field_decoders.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace stoker::pipeline {
namespace {

Status Decode(FieldKind kind, std::string_view text, FieldValue* out = nullptr) {
  FieldSpec spec;
  spec.name = "f";
  spec.kind = kind;
  spec.keys = {"x"};
  FieldValue value;
  return FieldDecoderFor(kind)({reinterpret_cast<const std::byte*>(text.data()), text.size()}, spec, {},
                               out ? out : &value);
}

TEST(FieldDecoders, JsonAsRfc8259SaysIt) {
  // As Python's json.loads (which also takes 1e400, as inf).
  for (std::string_view ok : std::initializer_list<std::string_view>{
           "{}", "[]", "0", "-0", "1e400", "-12.5E-3", "\"a\\u00e9\\n\\\"\"", "true", "null", " [1, [2, {\"a\": []}]] ",
           "{\"a\": {\"b\": [true, false, null]}, \"c\": \"\\/\"}", "\"caf\xc3\xa9\"", "[[[[[[[[]]]]]]]]"})
    EXPECT_TRUE(Decode(FieldKind::kJson, ok).ok()) << ok;
  std::string deep(100000, '[');
  deep += std::string(100000, ']');
  EXPECT_TRUE(Decode(FieldKind::kJson, deep).ok());  // no recursion to overflow
  for (std::string_view bad : std::initializer_list<std::string_view>{"",
                                                                      "{",
                                                                      "[1,]",
                                                                      "{,}",
                                                                      "{\"a\":\"b\":1}",
                                                                      "{\"a\" 1}",
                                                                      "[1 2]",
                                                                      "01",
                                                                      "1.",
                                                                      ".5",
                                                                      "-",
                                                                      "1e",
                                                                      "\"\\x\"",
                                                                      "\"open",
                                                                      "[1] 2",
                                                                      "tru",
                                                                      "true1",
                                                                      "{\"a\":1,}",
                                                                      "{1:2}",
                                                                      "\"tab\there\"",
                                                                      "NaN",
                                                                      "[\"\\u12g4\"]",
                                                                      "\xff"}) {
    const Status s = Decode(FieldKind::kJson, bad);
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << bad;
  }
  EXPECT_NE(Decode(FieldKind::kJson, "[1,]").message().find("at byte 3"), std::string::npos);
}

TEST(FieldDecoders, NumbersAndText) {
  FieldValue v;
  ASSERT_TRUE(Decode(FieldKind::kInt, " -42\n", &v).ok());
  std::int64_t i = 0;
  std::memcpy(&i, v.tensor.data.data(), 8);
  EXPECT_EQ(i, -42);
  EXPECT_FALSE(Decode(FieldKind::kInt, "4 2").ok());
  EXPECT_FALSE(Decode(FieldKind::kInt, "99999999999999999999").ok());
  ASSERT_TRUE(Decode(FieldKind::kFloat, "2.5e-1", &v).ok());
  double d = 0;
  std::memcpy(&d, v.tensor.data.data(), 8);
  EXPECT_EQ(d, 0.25);
  EXPECT_FALSE(Decode(FieldKind::kFloat, "").ok());
  for (std::string_view bad :
       std::initializer_list<std::string_view>{"\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82", "a\x80"})
    EXPECT_EQ(Decode(FieldKind::kText, bad).code(), StatusCode::kCorruption) << bad;
  EXPECT_TRUE(Decode(FieldKind::kText, "\xf0\x9f\x98\x80 \xe2\x82\xac").ok());
}

}  // namespace
}  // namespace stoker::pipeline
