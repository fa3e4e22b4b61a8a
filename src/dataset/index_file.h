// Writing an index file: streamed through an AtomicFile, so that the file
// appears complete or not at all and is never held in memory whole; and
// where a large pack's restart tables wait until then.
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

// Where an IndexBuilder writing into `dir` keeps what it gathers per
// sample until the index is written (records and keys, about 100 bytes a
// sample; restart tables, about 0.5-1 KB a seekable JPEG: 1 GB for
// ImageNet): three scratch files there, appended and read back in blocks of
// `block_bytes`, or memory where `fs` has none.
[[nodiscard]] index_format::IndexBuilder::Stores BuilderStoresFor(FileSystem& fs, const std::string& dir,
                                                                  std::size_t block_bytes = std::size_t{1} << 20);

}  // namespace stoker
