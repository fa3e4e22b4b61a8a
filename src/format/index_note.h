// The index's note (JSON, index version 3 and later): what `stoker pack` did
// to the samples, and the class names its labels stand for. Written by pack,
// read by the dataset layer and `stoker inspect`.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace stoker::index_format {

// `note` (JSON text, or empty) with "classes": `names` added, label i
// standing for names[i]. Names that would take the note past kMaxNoteBytes
// are not kept: "classes_omitted" records their count instead. A note that
// is not a JSON object is kept under "note".
[[nodiscard]] std::string NoteWithClassNames(std::string_view note, std::span<const std::string> names);

// The class names a note records, in label order; empty when it records
// none (or is not the JSON pack writes).
[[nodiscard]] std::vector<std::string> ClassNamesInNote(std::string_view note);

}  // namespace stoker::index_format
