#include "stoker/pack.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "codec/jpeg.h"
#include "dataset/pack_test_util.h"
#include "pipeline/loader_test_util.h"
#include "stoker/dataset.h"
#include "test_util.h"

namespace stoker {
namespace {

using testing::FakeImage;
using testing::RandomBytes;
using testing::ReadFile;
using testing::TempDir;
using testing::Text;
using testing::WriteFile;

using testing::Keys;
using testing::MakeImageFolder;
using testing::PackInSmallShards;

TEST(Pack, ImageFolderRoundTrip) {
  TempDir dir;
  MakeImageFolder(dir / "src");
  ASSERT_OK_AND_ASSIGN(PackSummary summary, Pack(dir / "src", dir / "out"));
  EXPECT_EQ(summary.samples, 5u);
  EXPECT_EQ(summary.shards, 1u);
  EXPECT_EQ(summary.class_names, (std::vector<std::string>{"cat", "dog"}));

  ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(dir / "out"));
  EXPECT_EQ(dataset->num_samples(), 5u);
  EXPECT_EQ(dataset->field_names(), (std::vector<std::string>{"cls", "jpeg", "jpg", "png"}));
  EXPECT_EQ(Keys(*dataset), (std::vector<std::string>{"cat/1", "cat/2", "cat/img_v2", "dog/a", "dog/sub/b"}));
  ASSERT_OK_AND_ASSIGN(SampleInfo s3, dataset->Sample(3));
  EXPECT_EQ(s3.label, 1);
  auto jpg = *dataset->FieldIndex("jpg");
  ASSERT_OK_AND_ASSIGN(auto bytes, dataset->ReadField(3, jpg));
  EXPECT_EQ(Text(bytes), FakeImage("jpg", 5000, 4));
  ASSERT_OK_AND_ASSIGN(auto cls, dataset->ReadField(3, *dataset->FieldIndex("cls")));
  EXPECT_EQ(Text(cls), "1");
  EXPECT_EQ(dataset->ReadField(3, *dataset->FieldIndex("png")).error().code(), StatusCode::kNotFound);

  ASSERT_OK_AND_ASSIGN(VerifyReport report, Verify(*dataset));
  EXPECT_TRUE(report.ok());
  EXPECT_EQ(report.samples_checked, 5u);

  ASSERT_OK_AND_ASSIGN(DatasetSummary sum, Summarize(*dataset));
  EXPECT_EQ(sum.label_counts.at(0), 3u);
  EXPECT_EQ(sum.label_counts.at(1), 2u);
  EXPECT_EQ(sum.fields[2].name, "jpg");
  EXPECT_EQ(sum.fields[2].samples, 3u);
  EXPECT_EQ(sum.fields[2].bytes, 3000u + 5000u + 100u);

  // Files beside the class folders are left out, as ImageFolder leaves them, and said so.
  EXPECT_TRUE(summary.warnings.empty());
  WriteFile(dir / "src/README.txt", "about this data");
  ASSERT_OK_AND_ASSIGN(PackSummary one, Pack(dir / "src", dir / "out1"));
  EXPECT_EQ(one.samples, 5u);
  ASSERT_EQ(one.warnings.size(), 1u);
  EXPECT_NE(one.warnings[0].find("ignored 1 entry at the top of"), std::string::npos) << one.warnings[0];
  EXPECT_NE(one.warnings[0].find("that is not a class folder"), std::string::npos) << one.warnings[0];
  WriteFile(dir / "src/LICENSE", "yours");
  ASSERT_OK_AND_ASSIGN(PackSummary two, Pack(dir / "src", dir / "out2"));
  ASSERT_EQ(two.warnings.size(), 1u);
  EXPECT_NE(two.warnings[0].find("ignored 2 entries at the top of"), std::string::npos) << two.warnings[0];
  EXPECT_NE(two.warnings[0].find("that are not class folders"), std::string::npos) << two.warnings[0];
}

TEST(Pack, DeterministicAcrossThreadCounts) {
  TempDir dir;
  for (int c = 0; c < 4; ++c)
    for (int i = 0; i < 30; ++i)
      WriteFile(dir / ("src/c" + std::to_string(c) + "/" + std::to_string(i) + ".jpg"),
                FakeImage("jpg", 1000 + i * 97, c * 100 + i));
  PackOptions one;
  one.threads = 1;
  one.target_shard_bytes = 20000;
  PackOptions many = one;
  many.threads = 7;
  ASSERT_OK_AND_ASSIGN(auto a, Pack(dir / "src", dir / "a", one));
  ASSERT_OK_AND_ASSIGN(auto b, Pack(dir / "src", dir / "b", many));
  EXPECT_GT(a.shards, 5u);
  ASSERT_EQ(a.shards, b.shards);
  EXPECT_EQ(ReadFile(dir / "a/index.stoker"), ReadFile(dir / "b/index.stoker"));
  for (std::uint64_t i = 0; i < a.shards; ++i) {
    auto name = "/shard-" + std::string(6 - std::to_string(i).size(), '0') + std::to_string(i) + ".tar";
    EXPECT_EQ(ReadFile(dir.path() + "/a" + name), ReadFile(dir.path() + "/b" + name)) << name;
    EXPECT_LE(std::filesystem::file_size(dir.path() + "/a" + name), 20000u);
  }
  ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(dir / "a"));
  ASSERT_OK_AND_ASSIGN(auto report, Verify(*dataset));
  EXPECT_TRUE(report.ok());
  EXPECT_EQ(dataset->num_samples(), 120u);
}

// --shuffle: the same samples, labels and bytes, in an order set by the seed
// alone (not by threads), so shards mix classes.
TEST(Pack, ShuffleMixesClassesAcrossShardsDeterministically) {
  TempDir dir;
  for (int c = 0; c < 4; ++c)
    for (int i = 0; i < 30; ++i)
      WriteFile(dir / ("src/c" + std::to_string(c) + "/" + std::to_string(i) + ".jpg"),
                FakeImage("jpg", 1000 + i * 97, c * 100 + i));
  PackOptions options;
  options.target_shard_bytes = 20000;
  options.shuffle = true;
  options.shuffle_seed = 7;
  PackOptions again = options;
  again.threads = 5;
  PackOptions other = options;
  other.shuffle_seed = 8;
  ASSERT_OK_AND_ASSIGN(auto a, Pack(dir / "src", dir / "a", options));
  ASSERT_OK_AND_ASSIGN(auto b, Pack(dir / "src", dir / "b", again));
  ASSERT_OK_AND_ASSIGN(auto c, Pack(dir / "src", dir / "c", other));
  PackOptions in_order;
  in_order.target_shard_bytes = 20000;
  ASSERT_OK_AND_ASSIGN(auto plain, Pack(dir / "src", dir / "plain", in_order));
  EXPECT_EQ(ReadFile(dir / "a/index.stoker"), ReadFile(dir / "b/index.stoker"));
  ASSERT_OK_AND_ASSIGN(auto shuffled, Dataset::Open(dir / "a"));
  ASSERT_OK_AND_ASSIGN(auto reseeded, Dataset::Open(dir / "c"));
  ASSERT_OK_AND_ASSIGN(auto sorted, Dataset::Open(dir / "plain"));
  auto keys = Keys(*shuffled);
  EXPECT_NE(keys, Keys(*sorted));
  EXPECT_NE(keys, Keys(*reseeded));
  std::vector<std::string> all = keys;
  std::sort(all.begin(), all.end());
  auto expected = Keys(*sorted);
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(all, expected);
  // Labels and bytes travel with their samples; the first shard mixes classes.
  std::set<std::int64_t> first_shard_labels;
  const auto jpg = *shuffled->FieldIndex("jpg");
  for (std::uint64_t i = 0; i < shuffled->num_samples(); ++i) {
    ASSERT_OK_AND_ASSIGN(SampleInfo s, shuffled->Sample(i));
    const std::string key(s.key);
    EXPECT_EQ(s.label, key[1] - '0') << key;
    const int cls = key[1] - '0', n = std::stoi(key.substr(3));
    ASSERT_OK_AND_ASSIGN(auto bytes, shuffled->ReadField(i, jpg));
    EXPECT_EQ(Text(bytes), FakeImage("jpg", 1000 + n * 97, cls * 100 + n)) << key;
    if (s.shard == 0) first_shard_labels.insert(s.label);
  }
  EXPECT_GE(first_shard_labels.size(), 3u);
  ASSERT_OK_AND_ASSIGN(auto report, Verify(*shuffled));
  EXPECT_TRUE(report.ok());
}

TEST(Pack, FlippedByteIsNamedByVerify) {
  TempDir dir;
  MakeImageFolder(dir / "src");
  ASSERT_OK(Pack(dir / "src", dir / "out").status());
  ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(dir / "out"));
  ASSERT_OK_AND_ASSIGN(SampleInfo victim, dataset->Sample(3));  // dog/a
  auto loc = *victim.fields[*dataset->FieldIndex("jpg")];
  {
    std::fstream f(dir / "out/shard-000000.tar", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(loc.offset + 10));
    char c = 0;
    f.seekg(static_cast<std::streamoff>(loc.offset + 10));
    f.get(c);
    f.seekp(static_cast<std::streamoff>(loc.offset + 10));
    f.put(static_cast<char>(c ^ 0x40));
  }
  ASSERT_OK_AND_ASSIGN(auto report, Verify(*dataset));
  ASSERT_FALSE(report.ok());
  bool named = false;
  for (const auto& p : report.problems) {
    // The sample is named at its first member's data (its .cls, which sorts before .jpg).
    if (p.key == "dog/a" && p.where == "shard-000000.tar:" + std::to_string(victim.fields[0]->offset) &&
        p.message.find("sample checksum mismatch") != std::string::npos)
      named = true;
  }
  std::string all;
  for (const auto& p : report.problems) all += p.where + " " + p.key + " " + p.message + "\n";
  EXPECT_TRUE(named) << all;
}

TEST(Pack, CorruptTarHeaderIsNamedByVerify) {
  TempDir dir;
  MakeImageFolder(dir / "src");
  ASSERT_OK(Pack(dir / "src", dir / "out").status());
  ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(dir / "out"));
  ASSERT_OK_AND_ASSIGN(SampleInfo victim, dataset->Sample(1));  // cat/2: cls member header first
  std::uint64_t header = victim.fields[0]->offset - 512;
  {
    std::fstream f(dir / "out/shard-000000.tar", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(header + 2));
    f.put('#');
  }
  ASSERT_OK_AND_ASSIGN(auto report, Verify(*dataset));
  ASSERT_FALSE(report.ok());
  bool named = false;
  for (const auto& p : report.problems)
    if (p.key == "cat/2" && p.where == "shard-000000.tar:" + std::to_string(header)) named = true;
  EXPECT_TRUE(named);
}

TEST(Pack, MissingAndTruncatedShards) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto summary, PackInSmallShards(dir, "out"));
  ASSERT_GE(summary.shards, 3u);
  std::filesystem::remove(dir / "out/shard-000001.tar");
  std::filesystem::resize_file(dir / "out/shard-000002.tar", 600);
  ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(dir / "out"));
  ASSERT_OK_AND_ASSIGN(auto report, Verify(*dataset));
  std::string all;
  for (const auto& p : report.problems) all += p.where + " " + p.key + " " + p.message + "\n";
  EXPECT_NE(all.find("shard-000001.tar"), std::string::npos) << all;
  EXPECT_NE(all.find("No such file"), std::string::npos) << all;
  EXPECT_NE(all.find("shard-000002.tar"), std::string::npos) << all;
  EXPECT_NE(all.find("past the end of the shard"), std::string::npos) << all;
  auto read = dataset->ReadField(dataset->shards()[2].first_sample, *dataset->FieldIndex("jpg"));
  EXPECT_FALSE(read.ok());
}

TEST(Pack, BadInputsGetClearErrors) {
  TempDir dir;
  std::filesystem::create_directories(dir / "empty");
  auto r = Pack(dir / "empty", dir / "out1");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("no class sub-folders"), std::string::npos);

  std::filesystem::create_directories(dir / "emptyclass/a");
  WriteFile(dir / "emptyclass/b/x.jpg", "x");
  r = Pack(dir / "emptyclass", dir / "out2");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("emptyclass/a' holds no image files"), std::string::npos) << r.error().message();

  WriteFile(dir / "noext/a/README", "x");
  r = Pack(dir / "noext", dir / "out3");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("noext/a/README' has no file extension"), std::string::npos)
      << r.error().message();

  WriteFile(dir / "dupkey/a/x.y.jpg", "1");
  WriteFile(dir / "dupkey/a/x_y.png", "2");
  r = Pack(dir / "dupkey", dir / "out4");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("key 'a/x_y'"), std::string::npos) << r.error().message();

  r = Pack(dir / "does-not-exist", dir / "out5");
  ASSERT_FALSE(r.ok());

  MakeImageFolder(dir / "src");
  r = Pack(dir / "src", dir / "src/out");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("inside the source folder"), std::string::npos);
  EXPECT_FALSE(Dataset::Open(dir / "out4").ok());
}

TEST(Pack, RefusesToOverwriteUnlessForced) {
  TempDir dir;
  MakeImageFolder(dir / "src");
  PackOptions small;
  small.target_shard_bytes = 8192;
  ASSERT_OK_AND_ASSIGN(auto first, Pack(dir / "src", dir / "out", small));
  auto again = Pack(dir / "src", dir / "out");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), StatusCode::kAlreadyExists);
  PackOptions force;
  force.overwrite = true;
  ASSERT_OK_AND_ASSIGN(auto second, Pack(dir / "src", dir / "out", force));
  EXPECT_EQ(second.shards, 1u);
  EXPECT_GT(first.shards, 1u);
  EXPECT_FALSE(std::filesystem::exists(dir / "out/shard-000001.tar"));  // stale shards removed
  ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(dir / "out"));
  EXPECT_TRUE(Verify(*dataset)->ok());
}

// Without --force nothing pack did not write is deleted: files of our
// naming in the way are named, and other files are left alone.
TEST(Pack, NeverDeletesWhatItDidNotWriteWithoutForce) {
  TempDir dir;
  MakeImageFolder(dir / "src");
  WriteFile(dir / "out/shard-999999.tar", "the user's");
  WriteFile(dir / "out/notes.tmp", "the user's too");
  WriteFile(dir / "out/shard-000000.tar.tmp", "an old-style name: not ours to remove");
  auto r = Pack(dir / "src", dir / "out");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(r.error().message().find("holds 1 shard file this pack would overwrite or leave mixed with its own "
                                     "(shard-999999.tar)"),
            std::string::npos)
      << r.error().message();
  EXPECT_EQ(ReadFile(dir / "out/shard-999999.tar"), "the user's");
  std::filesystem::remove(dir / "out/shard-999999.tar");
  // With nothing of our naming in the way, it packs beside the other files.
  ASSERT_OK_AND_ASSIGN(auto summary, Pack(dir / "src", dir / "out"));
  EXPECT_EQ(ReadFile(dir / "out/notes.tmp"), "the user's too");
  EXPECT_EQ(ReadFile(dir / "out/shard-000000.tar.tmp"), "an old-style name: not ours to remove");
  // A dead stoker run's temporary (exact name, dead pid) is ours to clean.
  WriteFile(dir / "out/shard-000007.tar.tmp-999999999-3", "crashed run");
  PackOptions force;
  force.overwrite = true;
  ASSERT_OK(Pack(dir / "src", dir / "out", force).status());
  EXPECT_FALSE(std::filesystem::exists(dir / "out/shard-000007.tar.tmp-999999999-3"));
  EXPECT_TRUE(std::filesystem::exists(dir / "out/notes.tmp"));
}

// Keys become tar member names: one that climbs out of the folder, is
// absolute, or holds control characters is refused, naming its source.
TEST(Pack, KeysThatEscapeTheFolderAreRefused) {
  TempDir dir;
  WriteFile(dir / "img/a.jpg", "AAAA");
  for (std::string key : std::vector<std::string>{"../../etc/evil", "/abs/key", "a/../b", "x//y", "new\nline"}) {
    WriteFile(dir / "list.jsonl", "{\"path\": \"img/a.jpg\", \"key\": \"" + key + "\"}\n");
    auto r = Pack(dir / "list.jsonl", dir / ("out-" + std::to_string(std::hash<std::string>{}(key))));
    ASSERT_FALSE(r.ok()) << key;
    EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument) << key;
    EXPECT_NE(r.error().message().find("list.jsonl:1"), std::string::npos) << r.error().message();
  }
}

TEST(Pack, UnwritableOutputFails) {
  TempDir dir;
  MakeImageFolder(dir / "src");
  // A regular file where the output's parent folder should be: fails even for root.
  WriteFile(dir / "blocker", "x");
  auto r = Pack(dir / "src", dir / "blocker/out");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("blocker/out"), std::string::npos) << r.error().message();
  if (::geteuid() != 0) {  // root ignores directory permissions
    std::filesystem::create_directories(dir / "ro");
    std::filesystem::permissions(dir / "ro", std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    r = Pack(dir / "src", dir / "ro/out");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message().find("ro/out"), std::string::npos) << r.error().message();
  }
}

TEST(Pack, RepacksTarShardsAndIndexesThem) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto first, PackInSmallShards(dir, "a"));
  ASSERT_GE(first.shards, 3u);
  std::string pattern = dir / ("a/shard-{000000..00000" + std::to_string(first.shards - 1) + "}.tar");
  ASSERT_OK_AND_ASSIGN(auto repacked, Pack(pattern, dir / "b"));
  EXPECT_EQ(repacked.samples, 5u);
  EXPECT_EQ(repacked.shards, 1u);
  ASSERT_OK_AND_ASSIGN(auto b, Dataset::Open(dir / "b"));
  ASSERT_OK_AND_ASSIGN(auto a, Dataset::Open(dir / "a"));
  EXPECT_EQ(Keys(*a), Keys(*b));
  for (std::uint64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(a->Sample(i)->checksum, b->Sample(i)->checksum);
    EXPECT_EQ(a->Sample(i)->label, b->Sample(i)->label);
  }

  // Indexing the shards in place gives the same records as pack wrote.
  IndexOptions options;
  options.output = dir / "reindex.stoker";
  ASSERT_OK_AND_ASSIGN(auto indexed, IndexShards({pattern}, options));
  EXPECT_EQ(indexed.samples, 5u);
  ASSERT_OK_AND_ASSIGN(auto c, Dataset::Open(dir / "reindex.stoker"));
  EXPECT_EQ(Keys(*a), Keys(*c));
  EXPECT_EQ(c->shards()[0].path, "a/shard-000000.tar");
  for (std::uint64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(a->Sample(i)->checksum, c->Sample(i)->checksum);
    EXPECT_EQ(a->Sample(i)->fields, c->Sample(i)->fields);
  }
  EXPECT_TRUE(Verify(*c)->ok());
  EXPECT_EQ(IndexShards({pattern}, options).error().code(), StatusCode::kAlreadyExists);
}

TEST(Dataset, OpenErrorsAreClear) {
  TempDir dir;
  std::filesystem::create_directories(dir / "plain");
  auto r = Dataset::Open(dir / "plain");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("has no index.stoker"), std::string::npos);
  WriteFile(dir / "foreign.stoker", std::string(4096, 'x'));
  r = Dataset::Open(dir / "foreign.stoker");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), StatusCode::kCorruption);
  EXPECT_NE(r.error().message().find("foreign.stoker: not a valid stoker index"), std::string::npos);
}

}  // namespace
}  // namespace stoker

namespace stoker {
namespace {

// --max-side: large JPEGs re-encoded, small ones and other files byte-identical,
// what was done in the index, deterministic output, bad images named.
TEST(PackMaxSide, ShrinksLargeJpegsOnlyAndTheIndexSaysSo) {
  TempDir dir;
  const std::string large = MakeJpeg(640, 480, 1), small = MakeJpeg(200, 150, 2);
  WriteFile(dir / "src/a/large.jpg", large);
  WriteFile(dir / "src/a/small.jpg", small);
  WriteFile(dir / "src/b/other.png", FakeImage("png", 900, 7));
  PackOptions options;
  options.max_side = 256;
  options.quality = 85;
  ASSERT_OK_AND_ASSIGN(PackSummary summary, Pack(dir / "src", dir / "out", options));
  EXPECT_EQ(summary.images_reencoded, 1u);
  EXPECT_EQ(summary.reencoded_bytes_before, large.size());
  EXPECT_LT(summary.reencoded_bytes_after, large.size());
  ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(dir / "out"));
  const auto jpg = dataset->FieldIndex("jpg");
  ASSERT_TRUE(jpg.has_value());
  for (std::uint64_t i = 0; i < dataset->num_samples(); ++i) {
    ASSERT_OK_AND_ASSIGN(auto sample, dataset->Sample(i));
    if (sample.key == "a/small") {
      ASSERT_OK_AND_ASSIGN(auto bytes, dataset->ReadField(i, *jpg));
      EXPECT_EQ(Text(bytes), small) << "a small image stays byte-identical";
    } else if (sample.key == "a/large") {
      ASSERT_OK_AND_ASSIGN(auto bytes, dataset->ReadField(i, *jpg));
      ASSERT_OK_AND_ASSIGN(auto size, codec::JpegSize(bytes));
      EXPECT_EQ(size.width, 256);
      EXPECT_EQ(size.height, 192);
    }
  }
  const std::string note(dataset->pack_note());
  EXPECT_NE(note.find("\"max_side\":256"), std::string::npos) << note;
  EXPECT_NE(note.find("\"quality\":85"), std::string::npos) << note;
  EXPECT_NE(note.find("\"images_reencoded\":1,\"images_kept\":1"), std::string::npos) << note;
  ASSERT_OK_AND_ASSIGN(auto report, Verify(*dataset));
  EXPECT_TRUE(report.ok());

  // Deterministic: the same input gives the same shard and index bytes, whatever the threads.
  options.threads = 3;
  ASSERT_OK_AND_ASSIGN(PackSummary again, Pack(dir / "src", dir / "out2", options));
  EXPECT_EQ(ReadFile(dir / "out/shard-000000.tar"), ReadFile(dir / "out2/shard-000000.tar"));
  EXPECT_EQ(ReadFile(dir / "out/index.stoker"), ReadFile(dir / "out2/index.stoker"));

  // Without max_side nothing is decoded, and the note holds the class names alone.
  ASSERT_OK_AND_ASSIGN(PackSummary plain, Pack(dir / "src", dir / "plain"));
  ASSERT_OK_AND_ASSIGN(auto plain_dataset, Dataset::Open(dir / "plain"));
  EXPECT_EQ(plain_dataset->pack_note(), R"({"classes":["a","b"]})");
}

TEST(PackMaxSide, ABadImageIsAnErrorNamingIt) {
  TempDir dir;
  WriteFile(dir / "src/a/good.jpg", MakeJpeg(300, 300, 1));
  WriteFile(dir / "src/a/broken.jpg", "this is text, not a JPEG, but it says jpg");
  PackOptions options;
  options.max_side = 100;
  auto packed = Pack(dir / "src", dir / "out", options);
  ASSERT_FALSE(packed.ok());
  EXPECT_NE(packed.error().message().find("a/broken"), std::string::npos) << packed.error().ToString();
  EXPECT_NE(packed.error().message().find("broken.jpg"), std::string::npos) << packed.error().ToString();
  EXPECT_FALSE(std::filesystem::exists(dir / "out/index.stoker")) << "no dataset from a failed pack";

  PackOptions quality_alone;
  quality_alone.quality = 50;
  EXPECT_EQ(Pack(dir / "src", dir / "out", quality_alone).error().code(), StatusCode::kInvalidArgument);
  options.quality = 0;
  EXPECT_EQ(Pack(dir / "src", dir / "out", options).error().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stoker
