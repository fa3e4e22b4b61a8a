#include "format/tar.h"

#include <cstring>

#include <gtest/gtest.h>

#include "test_util.h"

namespace stoker::tar {
namespace {

using stoker::testing::Bytes;

std::string Archive(const std::vector<std::pair<std::string, std::string>>& files, bool end_marker = true) {
  std::string out;
  for (const auto& [name, data] : files) {
    EXPECT_TRUE(AppendFileHeader(out, name, data.size()).ok());
    out += data;
    out.append(PaddingAfter(data.size()), '\0');
  }
  if (end_marker) out.append(kEndOfArchiveSize, '\0');
  return out;
}

std::vector<Member> ReadAll(const std::string& archive) {
  Reader reader(Bytes(archive), "test.tar");
  std::vector<Member> out;
  while (true) {
    auto next = reader.Next();
    EXPECT_TRUE(next.ok()) << next.error().ToString();
    if (!next.ok() || !next->has_value()) break;
    out.push_back(**next);
  }
  return out;
}

TEST(Tar, RoundTripsShortNames) {
  std::string archive = Archive({{"a/b.jpg", "hello"}, {"a/b.cls", "3"}, {"empty.txt", ""}});
  EXPECT_EQ(archive.size() % kBlockSize, 0u);
  auto members = ReadAll(archive);
  ASSERT_EQ(members.size(), 3u);
  EXPECT_EQ(members[0].name, "a/b.jpg");
  EXPECT_EQ(members[0].size, 5u);
  EXPECT_EQ(members[0].header_offset, 0u);
  EXPECT_EQ(members[0].data_offset, 512u);
  EXPECT_EQ(archive.substr(members[0].data_offset, 5), "hello");
  EXPECT_EQ(members[1].header_offset, 1024u);
  EXPECT_EQ(members[2].size, 0u);
  EXPECT_EQ(members[2].type, MemberType::kRegular);
}

TEST(Tar, LongNamesUsePrefixOrPax) {
  std::string dir(120, 'd');
  std::string prefixed = dir + "/file.jpg";  // fits ustar prefix + name
  // Needs pax. (Appended: g++ 12 warns wrongly of std::string(300, 'x') + ".jpg" at -O2.)
  std::string huge(300, 'x');
  huge += ".jpg";
  auto members = ReadAll(Archive({{prefixed, "1"}, {huge, "22"}}));
  ASSERT_EQ(members.size(), 2u);
  EXPECT_EQ(members[0].name, prefixed);
  EXPECT_EQ(members[1].name, huge);
  EXPECT_EQ(members[1].size, 2u);
  EXPECT_EQ(members[1].header_offset, 1024u);  // the pax header belongs to the member
}

TEST(Tar, ToleratesMissingEndMarker) {
  auto members = ReadAll(Archive({{"a.txt", "x"}}, /*end_marker=*/false));
  ASSERT_EQ(members.size(), 1u);
}

TEST(Tar, ReadsGnuLongNameAndBase256Size) {
  // A GNU 'L' header carrying the name, then the member.
  std::string name(150, 'n');  // appended, as above
  name += ".bin";
  std::string archive;
  ASSERT_TRUE(AppendFileHeader(archive, "././@LongLink", name.size() + 1).ok());
  archive[156] = 'L';
  // fix the checksum after changing the type flag
  auto fix_checksum = [](std::string& a, std::size_t at) {
    std::memset(&a[at + 148], ' ', 8);
    unsigned sum = 0;
    for (std::size_t i = 0; i < 512; ++i) sum += static_cast<unsigned char>(a[at + i]);
    std::snprintf(&a[at + 148], 8, "%06o", sum);
  };
  fix_checksum(archive, 0);
  archive += name + '\0';
  archive.append(PaddingAfter(name.size() + 1), '\0');
  std::size_t header_at = archive.size();
  ASSERT_TRUE(AppendFileHeader(archive, "truncated-name", 3).ok());
  // Rewrite the size as GNU base-256.
  std::memset(&archive[header_at + 124], 0, 12);
  archive[header_at + 124] = static_cast<char>(0x80);
  archive[header_at + 135] = 3;
  fix_checksum(archive, header_at);
  archive += "abc";
  archive.append(PaddingAfter(3), '\0');
  auto members = ReadAll(archive);
  ASSERT_EQ(members.size(), 1u);
  EXPECT_EQ(members[0].name, name);
  EXPECT_EQ(members[0].size, 3u);
  EXPECT_EQ(members[0].header_offset, 0u);
}

TEST(Tar, RejectsCorruptHeader) {
  std::string archive = Archive({{"a.txt", "x"}, {"b.txt", "y"}});
  archive[1024 + 3] ^= 0x20;  // flip a bit in the second header's name
  Reader reader(Bytes(archive), "shard.tar");
  ASSERT_TRUE(reader.Next().ok());
  auto bad = reader.Next();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), StatusCode::kCorruption);
  EXPECT_NE(bad.error().message().find("shard.tar:1024"), std::string::npos) << bad.error().message();
  EXPECT_EQ(reader.offset(), 1024u);
}

TEST(Tar, RejectsTruncatedMember) {
  std::string archive = Archive({{"a.bin", std::string(2000, 'z')}}, false);
  archive.resize(512 + 1000);
  Reader reader(Bytes(archive), "cut.tar");
  auto bad = reader.Next();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("cut.tar:0: truncated"), std::string::npos) << bad.error().message();
}

// An archive cut inside the padding after its last member's data has lost
// its end too: it is truncated, not complete.
TEST(Tar, RejectsAnArchiveCutInsideThePadding) {
  std::string archive = Archive({{"a.bin", std::string(700, 'z')}}, false);
  archive.resize(512 + 700 + 100);  // 700 data bytes, then 100 of the 324 padding bytes
  Reader reader(Bytes(archive), "cut.tar");
  auto bad = reader.Next();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("cut.tar:0: truncated tar archive: it ends 100 bytes into the padding"),
            std::string::npos)
      << bad.error().message();
}

TEST(Tar, RejectsPartialHeaderAndGarbage) {
  std::string garbage(700, 'g');
  Reader reader(Bytes(garbage), "junk.tar");
  auto bad = reader.Next();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("checksum"), std::string::npos);
  std::string partial = Archive({{"a", "x"}}, true).substr(0, 1024 + 100);
  Reader r2(Bytes(partial), "p.tar");
  ASSERT_TRUE(r2.Next().ok());
  EXPECT_FALSE(r2.Next().ok());
}

TEST(Tar, HeaderIsDeterministic) {
  std::string a, b;
  ASSERT_TRUE(AppendFileHeader(a, "k/x.jpg", 1234).ok());
  ASSERT_TRUE(AppendFileHeader(b, "k/x.jpg", 1234).ok());
  EXPECT_EQ(a, b);
  EXPECT_FALSE(AppendFileHeader(a, "", 1).ok());
}

}  // namespace
}  // namespace stoker::tar
