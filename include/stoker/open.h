// stoker/open.h: the one way to open a dataset by location.
//
//   auto dataset = OpenDataset("imagenet-packed");          // folder with index.stoker
//   auto dataset = OpenDataset("data/index.stoker");        // the index itself
//   auto dataset = OpenDataset("photos/");                  // an ImageFolder tree, indexed in memory
//   auto dataset = OpenDataset("https://host/imagenet");    // remote, through the local shard cache
//   auto dataset = OpenDataset("s3://bucket/imagenet", options);
//
// Locations with a URL scheme go to the file system registered for it
// (http://, https:// and s3:// are built in; RegisterFileSystem adds more).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "stoker/dataset.h"
#include "stoker/file_system.h"
#include "stoker/remote.h"
#include "stoker/status.h"

namespace stoker {

struct OpenOptions {
  // For remote locations: the cache, connections, retries and deadlines.
  RemoteOptions remote;
  // A local folder without index.stoker is read as an ImageFolder tree of
  // loose image files (ROOT/<class>/**/<image>), indexed in memory; the
  // dataset then says loose_files(). False: such a folder is an error.
  bool image_folder = true;
};

// A local folder or index file, an ImageFolder tree, or a URL. Errors say
// what was tried and why it failed (a dangling link, a folder that is
// neither a packed dataset nor an ImageFolder, a 404, ...).
[[nodiscard]] Result<std::unique_ptr<Dataset>> OpenDataset(const std::string& location,
                                                           const OpenOptions& options = {});

// What a registered scheme's factory returns: the file system to read the
// dataset through (kept alive by the dataset) and where its index is there.
struct SchemeFileSystem {
  std::shared_ptr<FileSystem> file_system;
  std::string index_path;
};
using FileSystemFactory =
    std::function<Result<SchemeFileSystem>(const std::string& location, const OpenOptions& options)>;

// Routes locations that start with `scheme` (for example "gs://") to
// `factory`. Replaces an earlier registration of the same scheme.
// InvalidArgument unless `scheme` looks like "name://".
[[nodiscard]] Status RegisterFileSystem(const std::string& scheme, FileSystemFactory factory);

}  // namespace stoker
