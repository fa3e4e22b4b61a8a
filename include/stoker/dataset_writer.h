// stoker/dataset_writer.h: writing a dataset sample by sample, from a
// program rather than from files (`stoker pack` reads files).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/fields.h"
#include "stoker/file_system.h"
#include "stoker/pack.h"
#include "stoker/status.h"

namespace stoker {

struct DatasetWriterOptions {
  // A new shard starts when the next sample would take the current one past
  // this size (a single larger sample gets a shard of its own). >= 4096.
  std::uint64_t target_shard_bytes = std::uint64_t{64} << 20;
  // Replace a dataset already in the folder. Without it, Create() refuses a
  // folder holding an index or shard files of stoker's naming.
  bool overwrite = false;
  // Label i's name, kept in the index's note for readers (as ImageFolder's
  // classes are); empty for none.
  std::vector<std::string> class_names;
  // Image fields are checked as pack checks them (stoker/decode.h's
  // CheckImageHeader): one that fails is refused by Add(), since the loader
  // would fail on it later. With keep_bad_images it is stored as given,
  // counted and named (PackSummary::bad_images_kept, bad_images_named; the
  // index's note, which the loader reads).
  bool keep_bad_images = false;
  FileSystem* file_system = FileSystem::Default();
};

// One field of a sample, as WebDataset names it: "jpg", "cls", "mask.png",
// "boxes.npy". `kind` is what the index records for it (what `inspect`
// shows and the loader checks its specs against); ConventionalFieldKind()
// gives the one its name implies. Payloads are stored as given, fields of
// kind image once checked (DatasetWriterOptions::keep_bad_images).
struct SampleField {
  std::string_view name;
  std::span<const std::byte> bytes;
  FieldKind kind = FieldKind::kBytes;
};

// Writes samples into `out_dir` as shard-NNNNNN.tar files plus
// index.stoker: the same dataset `stoker pack` makes, which the loader,
// `inspect`, `verify` and the `webdataset` library read. Shards are written
// under temporary names and renamed once complete; the index is written
// last, by Finish(), so a writer that fails or is dropped unfinished leaves
// no dataset: it removes its temporary and the shards it wrote. The same
// samples give byte-identical files. Not thread-safe: one writer, one
// thread at a time.
class DatasetWriter {
 public:
  [[nodiscard]] static Result<std::unique_ptr<DatasetWriter>> Create(const std::string& out_dir,
                                                                     const DatasetWriterOptions& options = {});
  ~DatasetWriter();
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;

  // Appends one sample. `key` must be unique in the dataset and a clean
  // relative path whose last component holds no '.' (WebDataset splits a
  // member's name at the first '.' there); each field name must be
  // lower-case, non-empty and free of '/' (WebDataset lower-cases field
  // names as it reads them). A "cls" field, if any, is the sample's label
  // and must be a decimal integer. Fields may come in any order; they are
  // written sorted by name. A bad key or field (an image field that fails
  // the check too) is InvalidArgument naming the sample and field, and
  // leaves the writer as it was; a failed write leaves it unusable.
  [[nodiscard]] Status Add(std::string_view key, std::span<const SampleField> fields);

  [[nodiscard]] std::uint64_t samples() const;
  [[nodiscard]] std::uint64_t payload_bytes() const;

  // Ends the last shard and writes the index. InvalidArgument when no sample
  // was added. Afterwards the writer takes nothing more.
  [[nodiscard]] Result<PackSummary> Finish();

 private:
  struct Impl;
  explicit DatasetWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stoker
