// stoker/dataset.h: a packed dataset, opened through its index.
//
// A dataset is a folder of WebDataset-compatible tar shards plus one index
// file (`index.stoker`) that locates every sample. Opening maps the index and
// checks its header and tables; the cost does not depend on the sample count.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/fields.h"
#include "stoker/file_system.h"
#include "stoker/seekable.h"
#include "stoker/status.h"

namespace stoker {

// The index's file name inside a dataset folder.
inline constexpr std::string_view kIndexFileName = "index.stoker";
// The label of a sample without a `.cls` field.
inline constexpr std::int64_t kNoLabel = INT64_MIN;

struct ShardInfo {
  std::string path;       // as stored: relative to the index's folder, or absolute
  std::string full_path;  // resolved against the index's folder
  std::uint64_t size = 0;
  std::uint64_t checksum = 0;  // xxh3-64 of the whole shard file
  std::uint64_t first_sample = 0;
  std::uint64_t num_samples = 0;
};

// Where one field of a sample lies in its shard.
struct FieldLocation {
  std::uint64_t offset = 0;  // of the member's data, from the start of the shard
  std::uint64_t size = 0;
  friend bool operator==(const FieldLocation&, const FieldLocation&) = default;
};

// One sample's record. Valid while the Dataset lives.
struct SampleInfo {
  std::uint64_t index = 0;  // position in the dataset
  std::string_view key;
  std::uint32_t shard = 0;
  std::int64_t label = kNoLabel;
  std::uint64_t checksum = 0;  // xxh3-64 of the field payloads in field-name order
  // One entry per dataset field (Dataset::field_names() order); nullopt
  // where this sample lacks the field.
  std::vector<std::optional<FieldLocation>> fields;
};

class Dataset {
 public:
  // `path` is a dataset folder or an index file on `file_system`, which
  // must outlive the dataset. Most callers want OpenDataset (open.h), which also takes
  // URLs and ImageFolder trees.
  [[nodiscard]] static Result<std::unique_ptr<Dataset>> Open(const std::string& path,
                                                             FileSystem* file_system = FileSystem::Default());
  // The same on a file system the dataset keeps alive (a remote one).
  [[nodiscard]] static Result<std::unique_ptr<Dataset>> Open(const std::string& path,
                                                             std::shared_ptr<FileSystem> file_system);
  // An ImageFolder tree of loose image files (ROOT/<class>/**/<file>.<ext>,
  // labels from the sorted class names, as torchvision does), indexed in
  // memory without packing: each file is a one-sample "shard", opened for
  // each read. For trying stoker before packing and for comparison; packed
  // shards read faster.
  [[nodiscard]] static Result<std::unique_ptr<Dataset>> OpenImageFolder(
      const std::string& root, FileSystem* file_system = FileSystem::Default());
  // True for a dataset opened with OpenImageFolder.
  [[nodiscard]] bool loose_files() const;
  ~Dataset();
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;

  [[nodiscard]] std::uint64_t num_samples() const;
  [[nodiscard]] const std::vector<std::string>& field_names() const;
  // The position of `name` in field_names(), or nullopt.
  [[nodiscard]] std::optional<std::size_t> FieldIndex(std::string_view name) const;
  [[nodiscard]] const std::vector<ShardInfo>& shards() const;
  // What the index records about field `field` (field_names() order): the
  // kind its writer gave it (pack: from the manifest's values and the files'
  // extensions; index: by WebDataset's naming convention) and how many
  // samples have it. Indexes written by stoker before format version 4 hold
  // neither (nullopt).
  struct RecordedField {
    std::optional<FieldKind> kind;
    std::optional<std::uint64_t> samples;  // samples that have the field
    std::optional<std::uint64_t> bytes;    // their payloads' total size
  };
  [[nodiscard]] RecordedField recorded_field(std::size_t field) const;
  // Tar members the index leaves out as WebDataset does (no extension,
  // links, folders, __*__ names), as `stoker index` counted them.
  [[nodiscard]] std::uint64_t skipped_members() const;
  // What `stoker pack` did to the samples, as the index records it (JSON,
  // e.g. images re-encoded by --max-side/--quality); empty when it stored
  // them as they were.
  [[nodiscard]] std::string_view pack_note() const;
  // Image fields `stoker pack` or `stoker index` kept with --keep-bad-images
  // although they fail the header check (the loader cannot decode them), and
  // the first it named ("<key>, field '<name>'"); 0 when none.
  [[nodiscard]] std::uint64_t bad_images_kept() const;
  [[nodiscard]] const std::string& first_bad_image() const;
  // What each label stands for, label i being class_names()[i], as `stoker
  // pack` recorded it (an ImageFolder's class folders, a manifest's class
  // names), or an ImageFolder of loose files found it; empty when the labels
  // came as numbers (`.cls` files, `stoker index`).
  [[nodiscard]] const std::vector<std::string>& class_names() const;
  // How many payloads are seekable JPEGs with a restart table in the index
  // (`stoker pack --seekable-jpeg`).
  [[nodiscard]] std::uint64_t seekable_payloads() const;
  // Whether their restart tables come with region records (index version
  // 7), so that a reader can read only the MCU rows a crop covers.
  [[nodiscard]] bool has_region_records() const;
  // The restart table of sample `sample`'s field `field` into `table`:
  // intervals + 1 byte offsets into the payload, where each restart
  // interval's entropy-coded data starts and then where the last ends
  // (docs/format.md). False (`table` empty) when the index records none or
  // its entry is damaged. The loader checks a table against the JPEG before
  // using it. With `region`, its region record too (index version 7;
  // region->rows() == 0 without one): what reading only part of it needs.
  [[nodiscard]] bool RestartTable(std::uint64_t sample, std::size_t field, std::vector<std::uint32_t>& table,
                                  RegionRecord* region = nullptr) const;
  // Checks field `field` of `info` (its whole bytes: `payload`) against its
  // region record (index version 7): the check of every MCU row, and of the
  // rest of the sample (its other fields are read here). Ok when the index
  // records none; Corruption saying what differs otherwise (the loader then
  // reads that JPEG whole: no wrong pixels, but no read in part either).
  [[nodiscard]] Status CheckRegionRecord(const SampleInfo& info, std::size_t field,
                                         std::span<const std::byte> payload) const;
  // Tells the kernel how the shard files will be read (their read-ahead;
  // ReadableFile::AdviseAccess), for the files open now and those opened
  // later; loose files are read whole and keep the default. A hint only:
  // what is read does not change. The loader gives kRandom to a global
  // shuffle over local shards larger than the page cache can hold
  // (LoaderOptions::kernel_readahead).
  void AdviseShardAccess(AccessPattern pattern) const;
  // The index's location, as it may be printed (a URL's secrets hidden).
  [[nodiscard]] const std::string& index_path() const;

  // Reads the record of sample `i` from the index, validated.
  [[nodiscard]] Result<SampleInfo> Sample(std::uint64_t i) const;
  // Reads one field's bytes from its shard. Thread-safe. With `verify`, the
  // sample's other fields are read too and the sample is checked as
  // ReadFieldsOptions::verify says. Errors name the shard, offset and key.
  [[nodiscard]] Result<std::vector<std::byte>> ReadField(std::uint64_t sample, std::size_t field,
                                                         bool verify = true) const;
  // Same, into `out` (resized; its capacity is reused across calls).
  [[nodiscard]] Status ReadFieldInto(const SampleInfo& sample, std::size_t field, std::vector<std::byte>& out,
                                     bool verify = true) const;

  // One field to read with ReadFields.
  struct FieldRead {
    const SampleInfo* sample = nullptr;
    std::size_t field = 0;
    // Results: the field's bytes (inside ReadFields' `arena`), or why not.
    std::span<const std::byte> bytes;
    Status status;
    // With ReadFieldsOptions::verify: whether this read checks its whole
    // sample. Several reads of one sample need only one that checks.
    bool check = true;
    // Set to read a seekable JPEG in part (index version 7): only its head
    // (the bytes before its first restart interval), into `bytes`, and MCU
    // rows [first_row, end_row) of it, into `rows`. `table` and `region`
    // are the field's (RestartTable) and must outlive the call. A check
    // then reads the sample's other fields whole and checks every piece
    // against the region record (and the label against `.cls`), where a
    // whole read checks the sample's checksum.
    struct Part {
      const std::vector<std::uint32_t>* table = nullptr;
      const RegionRecord* region = nullptr;
      std::uint32_t first_row = 0, end_row = 0;
    };
    std::optional<Part> part;
    std::span<const std::byte> rows;  // result, with `part`
    // Result, with `part` and a check: the pieces read differ from the
    // region record (`status` is then Corruption). The record may be what
    // is wrong: a whole read (ReadFieldInto, checked by the sample's
    // checksum) tells.
    bool pieces_disagree = false;
  };
  struct ReadFieldsOptions {
    // Fields of one shard closer than this are read with one request (the
    // bytes between are read and ignored: tar headers, other fields).
    std::uint64_t max_gap = 64 << 10;
    // ... as long as the merged request stays below this.
    std::uint64_t max_request = 8 << 20;
    // Check each sample against its index record: every field of the sample
    // is read, their xxh3 must equal the record's checksum, and a `.cls`
    // field must hold the record's label. A mismatch is Corruption naming
    // the sample. Datasets of loose files (no checksums) are not checked.
    bool verify = true;
  };
  // Reads several fields at once into `arena` (resized; its capacity is
  // reused): neighbouring fields are merged into one request, and every
  // request is submitted together (io_uring where the kernel allows it).
  // Outcomes go to each FieldRead; errors name the shard, offset and key.
  // Returns the number of requests issued.
  std::size_t ReadFields(std::span<FieldRead> reads, std::vector<std::byte>& arena,
                         const ReadFieldsOptions& options) const;
  std::size_t ReadFields(std::span<FieldRead> reads, std::vector<std::byte>& arena) const {
    return ReadFields(reads, arena, ReadFieldsOptions{});
  }

  // Checks the checksum over the index's per-sample records (reads them all,
  // unlike Open). Corruption names the index file.
  [[nodiscard]] Status VerifyIndexChecksum() const;
  // A packed dataset on the local file system: every shard file the index
  // names exists (NotFound otherwise) and, with `sizes`, has the size the
  // index records (Corruption otherwise: changed after indexing), each
  // looked up with one stat, so a loader fails at its creation rather than
  // when an epoch reaches the shard. Up to 3 shards are named, with the
  // count. Ok for other file systems (remote shards are checked as they
  // arrive) and for loose files.
  [[nodiscard]] Status CheckShardFiles(bool sizes) const;
  [[nodiscard]] FileSystem* file_system() const;

  struct Impl;

 private:
  explicit Dataset(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// What `stoker inspect` shows.
struct DatasetSummary {
  std::uint64_t num_samples = 0;
  // Tar members the index leaves out as WebDataset does (no extension,
  // links, directories, __*__ names), as `stoker index` counted them.
  std::uint64_t skipped_members = 0;
  std::string pack_note;                 // Dataset::pack_note()
  std::vector<std::string> class_names;  // Dataset::class_names()
  std::uint64_t seekable_payloads = 0;   // Dataset::seekable_payloads()
  bool region_records = false;           // Dataset::has_region_records()
  std::uint64_t num_shards = 0;
  std::uint64_t shard_bytes = 0;  // sum of shard file sizes
  struct Field {
    std::string name;
    std::uint64_t samples = 0;  // samples that have it
    std::uint64_t bytes = 0;
    FieldKind kind = FieldKind::kBytes;  // as recorded, else by WebDataset's convention
    bool kind_recorded = false;          // false: from the name's convention (an older index)
  };
  std::vector<Field> fields;
  std::uint64_t unlabelled = 0;
  std::map<std::int64_t, std::uint64_t> label_counts;
};
[[nodiscard]] Result<DatasetSummary> Summarize(const Dataset& dataset);

// One problem found by Verify.
struct VerifyProblem {
  std::string where;  // "shard-000001.tar:1536" or the shard path
  std::string key;    // the sample key, when the problem is in one sample
  std::string message;
};
struct VerifyReport {
  std::uint64_t samples_checked = 0;
  std::uint64_t shards_checked = 0;
  std::uint64_t bytes_checked = 0;
  std::vector<VerifyProblem> problems;  // empty when everything checks out
  [[nodiscard]] bool ok() const { return problems.empty(); }
};
struct VerifyOptions {
  // Called after each shard with (shards done, bytes done); may be empty.
  std::function<void(std::uint64_t, std::uint64_t)> on_progress;
};
// Checks the index's record checksum, every shard's size and checksum, every
// sample's checksum, and that the tar members match the index. Returns a
// report of every problem; a non-OK Status only when checking itself fails.
[[nodiscard]] Result<VerifyReport> Verify(const Dataset& dataset, const VerifyOptions& options = {});

}  // namespace stoker
