// Writing an index file: streamed through an AtomicFile, so that the file
// appears complete or not at all and is never held in memory whole.
#pragma once

#include <functional>
#include <string>

#include "format/index_writer.h"
#include "stoker/file_system.h"
#include "stoker/status.h"

namespace stoker {

// Creates `path` atomically from what `write` gives its sink (IndexBuilder::
// FinishTo, index_format::WriteIndex). When `write` fails, nothing appears.
[[nodiscard]] Status WriteIndexFile(FileSystem& fs, const std::string& path,
                                    const std::function<Status(index_format::ByteSink&)>& write);

}  // namespace stoker
