#include "stoker/byte_size.h"

#include <gtest/gtest.h>

namespace stoker {
namespace {

TEST(ByteSize, Parses) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("64MiB"), 64u << 20);
  EXPECT_EQ(*ParseByteSize("64mib"), 64u << 20);
  EXPECT_EQ(*ParseByteSize("2GB"), 2'000'000'000u);
  EXPECT_EQ(*ParseByteSize("1.5GiB"), 1610612736u);
  EXPECT_EQ(*ParseByteSize("10 KiB"), 10240u);
}

TEST(ByteSize, RejectsGarbage) {
  EXPECT_FALSE(ParseByteSize("").ok());
  EXPECT_FALSE(ParseByteSize("MiB").ok());
  EXPECT_FALSE(ParseByteSize("12 parsecs").ok());
  EXPECT_FALSE(ParseByteSize("-5").ok());
  EXPECT_FALSE(ParseByteSize("1e30TiB").ok());
}

TEST(ByteSize, Formats) {
  EXPECT_EQ(FormatBytes(812), "812 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(64u << 20), "64.0 MiB");
}

}  // namespace
}  // namespace stoker
