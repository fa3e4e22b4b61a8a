// The index note's class names: added beside what pack's rewriters noted,
// read back in label order, left out (and counted) past the note's limit.
#include "format/index_note.h"

#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "format/index_format.h"
#include "test_util.h"

namespace stoker::index_format {
namespace {

TEST(IndexNote, ClassNamesGoBesideWhatTheNoteSaysAndReadBackInLabelOrder) {
  const std::vector<std::string> names = {"cat", "dog", "n01440764", "caf\xc3\xa9"};
  const std::string alone = NoteWithClassNames("", names);
  EXPECT_EQ(alone, "{\"classes\":[\"cat\",\"dog\",\"n01440764\",\"caf\xc3\xa9\"]}");  // UTF-8 as it is
  EXPECT_EQ(ClassNamesInNote(alone), names);
  const std::string beside = NoteWithClassNames(R"({"max_side":256,"quality":90})", names);
  EXPECT_EQ(beside.rfind(R"({"max_side":256,"quality":90,"classes":[)", 0), 0u) << beside;
  EXPECT_EQ(ClassNamesInNote(beside), names);
  EXPECT_EQ(NoteWithClassNames(R"({"max_side":256})", {}), R"({"max_side":256})");  // no names: as it was
  EXPECT_EQ(NoteWithClassNames("", {}), "");
  const std::vector<std::string> one = {"a"};
  EXPECT_EQ(ClassNamesInNote(NoteWithClassNames("plain words", one)), one);  // kept under "note"
}

TEST(IndexNote, NamesPastTheNotesLimitAreCountedNotKept) {
  const std::vector<std::string> names(kMaxNoteBytes / 16, std::string(20, 'x'));
  const std::string note = NoteWithClassNames("", names);
  EXPECT_LE(note.size(), kMaxNoteBytes);
  EXPECT_EQ(note, "{\"classes_omitted\":" + std::to_string(names.size()) + "}");
  EXPECT_TRUE(ClassNamesInNote(note).empty());
}

TEST(IndexNote, ANoteThatIsNotPacksJsonHasNoClassNames) {
  for (const char* note : {"", "not json", "[1,2]", R"({"classes":"cat"})", R"({"classes":["cat",3]})", "{"})
    EXPECT_TRUE(ClassNamesInNote(note).empty()) << note;
}

// A merged index's note: class names as the parts that record them record
// them, seekable counts added up, what every part says alike kept, the rest
// listed per part; class names that differ refused with the first label.
TEST(IndexNote, AMergedNoteKeepsWhatThePartsSayAlikeAndAddsUpTheirCounts) {
  const std::string a =
      R"({"max_side":256,"seekable_jpeg":{"method":"lossless","images_rewritten":3,"kept_progressive":1},"classes":["cat","dog"]})";
  const std::string b = R"({"max_side":256,"seekable_jpeg":{"method":"lossless","images_rewritten":4}})";
  const std::string c = R"({"max_side":512,"classes":["cat","dog"]})";
  const std::string_view notes[] = {a, b, c, ""};
  const std::string where[] = {"a", "b", "c", "d"};
  ASSERT_OK_AND_ASSIGN(std::string merged, MergedNote(notes, where));
  EXPECT_EQ(
      merged,
      R"({"classes":["cat","dog"],"seekable_jpeg":{"method":"lossless","images_rewritten":7,"kept_progressive":1},)"
      R"("merged":{"parts":4,"differing":{"max_side":[256,256,512,null]}}})");
  EXPECT_EQ(ClassNamesInNote(merged), (std::vector<std::string>{"cat", "dog"}));
  const std::string_view alike[] = {b, b};
  ASSERT_OK_AND_ASSIGN(merged, MergedNote(alike, where));
  EXPECT_EQ(merged,
            R"({"seekable_jpeg":{"method":"lossless","images_rewritten":8},"max_side":256,"merged":{"parts":2}})");
  // pack --max-side's counts add up when every part has them.
  const std::string shrunk1 = R"({"max_side":256,"images_reencoded":2,"images_kept":3})";
  const std::string shrunk2 = R"({"max_side":256,"images_reencoded":5,"images_kept":1})";
  const std::string_view shrunk[] = {shrunk1, shrunk2};
  ASSERT_OK_AND_ASSIGN(merged, MergedNote(shrunk, where));
  EXPECT_EQ(merged, R"({"images_reencoded":7,"images_kept":4,"max_side":256,"merged":{"parts":2}})");
  const std::string other = R"({"classes":["cat","emu"]})";
  const std::string_view differ[] = {a, b, other};
  auto refused = MergedNote(differ, where);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("parts 'a' and 'c'"), std::string::npos) << refused.error().message();
  EXPECT_NE(refused.error().message().find("label 1 is \"dog\" against \"emu\""), std::string::npos);
  const std::string omitted = R"({"classes_omitted":30000})";
  const std::string_view mixed[] = {a, omitted};
  EXPECT_FALSE(MergedNote(mixed, where).ok());
}

// Notes of many keys (a user's note may hold tens of thousands in its 1 MiB):
// every key is kept or listed, in the order first seen.
// Parts packed with --keep-bad-images: the merged note counts them all and
// names the smallest keys of any part; readers find them there.
TEST(IndexNote, AMergedNoteAddsUpBadImagesAndKeepsTheSmallestNames) {
  const std::string a =
      R"({"bad_images":{"kept":4,"named":{"a/3, field 'jpg'":"x","a/4, field 'jpg'":"x","a/5, field 'jpg'":"x",)"
      R"("a/6, field 'jpg'":"x"}}})";
  const std::string b = R"({"bad_images":{"kept":2,"named":{"a/1, field 'png'":"y","b/1, field 'jpg'":"y"}}})";
  const std::string c = R"({"max_side":256})";
  const std::vector<std::string_view> notes = {a, b, c};
  const std::vector<std::string> where = {"a", "b", "c"};
  ASSERT_OK_AND_ASSIGN(std::string merged, MergedNote(notes, where));
  const auto note = nlohmann::json::parse(merged);
  EXPECT_EQ(note["bad_images"]["kept"], 6) << merged;
  std::vector<std::string> named;
  for (const auto& [name, why] : note["bad_images"]["named"].items()) named.push_back(name);
  EXPECT_EQ(named, (std::vector<std::string>{"a/1, field 'png'", "a/3, field 'jpg'", "a/4, field 'jpg'",
                                             "a/5, field 'jpg'", "a/6, field 'jpg'"}))
      << merged;
  EXPECT_FALSE(note["merged"].contains("differing") && note["merged"]["differing"].contains("bad_images")) << merged;
  const BadImagesNoted read = BadImagesInNote(merged);
  EXPECT_EQ(read.kept, 6u);
  EXPECT_EQ(read.first, "a/1, field 'png'");
  EXPECT_EQ(BadImagesInNote(c).kept, 0u);
  EXPECT_EQ(BadImagesInNote("not json").kept, 0u);
  EXPECT_EQ(BadImagesInNote(R"({"bad_images":{"kept":"many"}})").kept, 0u);
}

TEST(IndexNote, NotesOfManyKeysMergeKeyByKey) {
  constexpr int kKeys = 5000;
  std::string a = "{", b = "{";
  for (int k = 0; k < kKeys; ++k) {
    a += fmt::format(R"({}"k{}":{})", k ? "," : "", k, k);
    b += fmt::format(R"({}"k{}":{})", k ? "," : "", k, k % 2 ? -k : k);  // odd keys differ
  }
  b += R"(,"only_b":1})";
  a += "}";
  const std::string_view notes[] = {a, b};
  const std::string where[] = {"a", "b"};
  ASSERT_OK_AND_ASSIGN(std::string merged, MergedNote(notes, where));
  const auto json = nlohmann::ordered_json::parse(merged);
  ASSERT_TRUE(json.contains("merged"));
  const auto& differing = json["merged"]["differing"];
  EXPECT_EQ(differing.size(), kKeys / 2 + 1);
  EXPECT_EQ(differing["k1"], nlohmann::ordered_json::parse("[1,-1]"));
  EXPECT_EQ(differing["only_b"], nlohmann::ordered_json::parse("[null,1]"));
  EXPECT_EQ(json["k0"], 0);
  EXPECT_EQ(json["k4998"], 4998);
  EXPECT_FALSE(json.contains("k1"));
  EXPECT_EQ(json.begin().key(), "k0");  // the order first seen
}

}  // namespace
}  // namespace stoker::index_format
