#include "format/webdataset.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace stoker::wds {
namespace {

TEST(WebDataset, SplitsAtFirstDotOfLastComponent) {
  auto s = SplitMemberName("a/b.seg.png");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->key, "a/b");
  EXPECT_EQ(s->field, "seg.png");
  s = SplitMemberName("dir.v2/img.JPG");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->key, "dir.v2/img");
  EXPECT_EQ(s->field, "jpg");
  EXPECT_FALSE(SplitMemberName("README"));
  EXPECT_FALSE(SplitMemberName("a.b/noext"));
  EXPECT_FALSE(SplitMemberName(".hidden"));
  // As Python's re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$") gives:
  s = SplitMemberName("a/.hidden.jpg");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->key, "a/");
  EXPECT_EQ(s->field, "hidden.jpg");
  EXPECT_FALSE(SplitMemberName("a.b/.hidden"));
  EXPECT_FALSE(SplitMemberName("x/y.z/.w.q"));
  EXPECT_EQ(SplitMemberName("a//.x")->key, "a//");
  EXPECT_EQ(SplitMemberName("/.x.jpg")->key, "/");
  s = SplitMemberName("./x.tar.gz");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->key, "./x");
  EXPECT_EQ(s->field, "tar.gz");
}

TEST(WebDataset, MetaMembers) {
  EXPECT_TRUE(IsMetaMember("__index__"));
  EXPECT_TRUE(IsMetaMember("__meta__/info.json"));
  EXPECT_FALSE(IsMetaMember("a/__index__"));
  EXPECT_FALSE(IsMetaMember("__x"));
  EXPECT_FALSE(IsMetaMember("__x.jpg"));
}

TEST(WebDataset, ParsesLabels) {
  EXPECT_EQ(ParseLabel("42"), 42);
  EXPECT_EQ(ParseLabel(" 7\n"), 7);
  EXPECT_EQ(ParseLabel("-3"), -3);
  EXPECT_FALSE(ParseLabel("cat"));
  EXPECT_FALSE(ParseLabel(""));
  EXPECT_FALSE(ParseLabel("1 2"));
}

TEST(WebDataset, ExpandsBraces) {
  auto r = ExpandBraces("data-{000008..000011}.tar");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (std::vector<std::string>{"data-000008.tar", "data-000009.tar", "data-000010.tar", "data-000011.tar"}));
  r = ExpandBraces("{a,b}/x-{1..2}.tar");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (std::vector<std::string>{"a/x-1.tar", "a/x-2.tar", "b/x-1.tar", "b/x-2.tar"}));
  EXPECT_EQ(*ExpandBraces("plain.tar"), std::vector<std::string>{"plain.tar"});
  EXPECT_FALSE(ExpandBraces("x-{1..").ok());
  EXPECT_FALSE(ExpandBraces("x-{5..1}").ok());
  EXPECT_FALSE(ExpandBraces("x-{a..b}").ok());
  EXPECT_FALSE(ExpandBraces("x}").ok());
}

std::string Archive(const std::vector<std::pair<std::string, std::string>>& files) {
  std::string out;
  for (const auto& [name, data] : files) {
    EXPECT_TRUE(tar::AppendFileHeader(out, name, data.size()).ok());
    out += data;
    out.append(tar::PaddingAfter(data.size()), '\0');
  }
  out.append(tar::kEndOfArchiveSize, '\0');
  return out;
}

TEST(WebDataset, GroupsAdjacentMembersIntoSamples) {
  std::string archive = Archive({{"__meta__", "m"},
                                 {"x/a.jpg", "A"},
                                 {"x/a.cls", "1"},
                                 {"x/b.seg.png", "S"},
                                 {"x/b.jpg", "B"},
                                 {"x/a.txt", "again"}});
  std::vector<TarSample> samples;
  std::vector<SkippedMember> skipped;
  ASSERT_OK(ForEachSample(
      stoker::testing::Bytes(archive), "t.tar",
      [&](const TarSample& s) {
        samples.push_back(s);
        return Status::Ok();
      },
      [&](const SkippedMember& m) { skipped.push_back(m); }));
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].name, "__meta__");
  EXPECT_EQ(skipped[0].header_offset, 0u);
  ASSERT_EQ(samples.size(), 3u);  // x/a appears again after x/b: a new sample, as in WebDataset
  EXPECT_EQ(samples[0].key, "x/a");
  ASSERT_EQ(samples[0].fields.size(), 2u);
  EXPECT_EQ(samples[0].fields[1].name, "cls");
  EXPECT_EQ(samples[1].fields[0].name, "seg.png");
  EXPECT_EQ(samples[2].key, "x/a");
}

TEST(WebDataset, RejectsDuplicateFieldAndSkipsMembersWithoutExtension) {
  std::vector<SkippedMember> skipped;
  std::vector<std::string> keys;
  auto run = [&](const std::string& archive) {
    skipped.clear();
    keys.clear();
    return ForEachSample(
        stoker::testing::Bytes(archive), "t.tar",
        [&](const TarSample& s) {
          keys.push_back(s.key);
          return Status::Ok();
        },
        [&](const SkippedMember& m) { skipped.push_back(m); });
  };
  Status dup = run(Archive({{"k.jpg", "1"}, {"k.JPG", "2"}}));
  EXPECT_EQ(dup.code(), StatusCode::kCorruption);
  EXPECT_NE(dup.message().find("t.tar:1024: sample 'k' has field 'jpg' twice"), std::string::npos) << dup.message();
  // As the webdataset library does: a member without an extension has no
  // key; it is left out (and reported), the samples around it are kept.
  ASSERT_OK(run(Archive({{"k.jpg", "1"}, {"dir/README", "2"}, {"m.jpg", "3"}})));
  EXPECT_EQ(keys, (std::vector<std::string>{"k", "m"}));
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].name, "dir/README");
  EXPECT_EQ(skipped[0].header_offset, 1024u);
  EXPECT_EQ(skipped[0].why, "no extension, so no sample key");
}

}  // namespace
}  // namespace stoker::wds
