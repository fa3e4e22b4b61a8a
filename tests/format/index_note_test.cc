// The index note's class names: added beside what pack's rewriters noted,
// read back in label order, left out (and counted) past the note's limit.
#include "format/index_note.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "format/index_format.h"

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

}  // namespace
}  // namespace stoker::index_format
