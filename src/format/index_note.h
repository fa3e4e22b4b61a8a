// The index's note (JSON, index version 3 and later): what `stoker pack` did
// to the samples, and the class names its labels stand for. Written by pack,
// read by the dataset layer and `stoker inspect`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/status.h"

namespace stoker::index_format {

// `note` (JSON text, or empty) with "classes": `names` added, label i
// standing for names[i]. Names that would take the note past kMaxNoteBytes
// are not kept: "classes_omitted" records their count instead. A note that
// is not a JSON object is kept under "note".
[[nodiscard]] std::string NoteWithClassNames(std::string_view note, std::span<const std::string> names);

// The class names a note records, in label order; empty when it records
// none (or is not the JSON pack writes).
[[nodiscard]] std::vector<std::string> ClassNamesInNote(std::string_view note);

// What pack or index --keep-bad-images recorded under "bad_images": how
// many image fields it kept that fail the header check, and the first it
// named ("<key>, field '<name>'"); 0 and empty when none (or not the JSON
// pack writes).
// How many kept bad images a note names (the smallest keys).
inline constexpr std::size_t kBadImagesNamedInNote = 5;
struct BadImagesNoted {
  std::uint64_t kept = 0;
  std::string first;
};
[[nodiscard]] BadImagesNoted BadImagesInNote(std::string_view note);

// The note of an index merged from indexes with notes `notes` (`where[i]`
// names part i in errors): the class names ("classes", or
// "classes_omitted") every part that records them records, the counts of
// "seekable_jpeg" and "bad_images" added up (the smallest named bad images
// kept), and any other entry every part holds alike;
// entries the parts hold differently are listed under "merged"
// ("differing": each part's value, null where it has none), left out when
// they would take the note past kMaxNoteBytes. InvalidArgument naming two
// parts and the first label they name differently when their class names
// differ.
[[nodiscard]] Result<std::string> MergedNote(std::span<const std::string_view> notes,
                                             std::span<const std::string> where);

}  // namespace stoker::index_format
