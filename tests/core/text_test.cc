// What users see: one-line names and URLs without their secrets.
#include "stoker/text.h"

#include <gtest/gtest.h>

namespace stoker {
namespace {

TEST(Text, PrintableEscapesControlCharacters) {
  EXPECT_EQ(Printable("plain/key_1"), "plain/key_1");
  EXPECT_EQ(Printable("a\nb\tc\\d"), "a\\nb\\tc\\\\d");
  EXPECT_EQ(Printable(std::string_view("nul\0end", 7)), "nul\\x00end");
  EXPECT_EQ(Printable("\x1b[31mred"), "\\x1b[31mred");
  EXPECT_EQ(Printable("caf\xc3\xa9"), "caf\xc3\xa9");  // UTF-8 passes
}

TEST(Text, RedactUrlHidesPasswordsAndSignatures) {
  EXPECT_EQ(RedactUrl("https://user:hunter2@host/data/index.stoker"), "https://user:***@host/data/index.stoker");
  EXPECT_EQ(RedactUrl("https://token@host/x"), "https://***@host/x");
  EXPECT_EQ(RedactUrl("https://h/x?X-Amz-Signature=abc&X-Amz-Credential=k%2F1&part=2&token=t#f"),
            "https://h/x?X-Amz-Signature=***&X-Amz-Credential=***&part=2&token=***#f");
  EXPECT_EQ(RedactUrl("https://h/x?sig=abc&sv=2021"), "https://h/x?sig=***&sv=2021");
  EXPECT_EQ(RedactUrl("s3://bucket/key"), "s3://bucket/key");
  EXPECT_EQ(RedactUrl("/local/path?x=1"), "/local/path?x=1");  // not a URL
  EXPECT_EQ(RedactUrl(RedactUrl("https://a:b@h/?token=1")), RedactUrl("https://a:b@h/?token=1"));
}

TEST(Text, RedactUrlsInFindsUrlsInsideMessages) {
  EXPECT_EQ(RedactUrlsIn("unavailable: https://u:p@h/a?token=x: HTTP 503 (see 'http://v:q@i/j')"),
            "unavailable: https://u:***@h/a?token=***: HTTP 503 (see 'http://v:***@i/j')");
  EXPECT_EQ(RedactUrlsIn("no urls here"), "no urls here");
}

}  // namespace
}  // namespace stoker
