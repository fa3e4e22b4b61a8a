// stoker/pack.h: turning many small files into indexed shards, and indexing
// shards that exist already.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "stoker/dataset.h"
#include "stoker/file_system.h"
#include "stoker/status.h"

namespace stoker {

struct PackProgress {
  std::uint64_t samples_done = 0;
  std::uint64_t samples_total = 0;
  std::uint64_t bytes_done = 0;  // input payload bytes written so far
};

struct PackOptions {
  // A new shard starts when the next sample would take the current one past
  // this size (a single larger sample gets a shard of its own).
  std::uint64_t target_shard_bytes = std::uint64_t{64} << 20;
  // Reader threads; 0 picks a default suited to small-file I/O.
  unsigned threads = 0;
  // Replace a dataset already in the output folder (and remove what is in
  // the way: shards of an earlier pack, a stale index). Without it, Pack
  // refuses a folder holding files it would overwrite or leave mixed with
  // its own, and names them.
  bool overwrite = false;
  FileSystem* file_system = FileSystem::Default();
  // Called from the writing thread after each sample; may be empty.
  std::function<void(const PackProgress&)> on_progress;
  // Lighter images (0: off). A JPEG whose longest side, once turned as its
  // EXIF orientation says, is over max_side pixels is decoded, turned,
  // resized so that side is max_side (aspect kept; the other side rounded,
  // at least 1) with Pillow's antialiased bilinear filter, and re-encoded
  // (4:2:0, `quality`, no EXIF). Other images stay byte-identical. The index
  // records what was done (Dataset::pack_note()). A JPEG that does not
  // decode is an error naming the sample and its file.
  std::uint32_t max_side = 0;
  int quality = 90;  // 1-100, for re-encoded images
  // Seekable JPEGs: each baseline JPEG (after max_side, when set) is
  // re-written losslessly (its DCT coefficients written back with a restart
  // marker every few MCUs and optimised Huffman tables, metadata kept), the
  // result checked to decode to exactly the original's pixels, and the
  // offset of every restart interval recorded in the index, so that the
  // loader entropy-decodes only the part of an image a crop covers.
  // Progressive, arithmetic-coded and CMYK JPEGs, and files that do not
  // decode, are stored unchanged and counted (PackSummary, the index's note).
  bool seekable_jpeg = false;
  // Write the samples in a random order (deterministic for `shuffle_seed`)
  // instead of the source's; an ImageFolder tree's is class by class, so
  // each shard would hold one or two classes. Mixed shards let shard-aware
  // orders (Order::kShardBlockShuffle: what a remote dataset read through a
  // cache smaller than the data uses) give batches as varied in labels as a
  // global shuffle's.
  bool shuffle = false;
  std::uint64_t shuffle_seed = 0;
  // Manifests only: further columns holding a file's path besides `path`
  // (e.g. {"mask"}). Each becomes the field "<column>.<extension>"
  // ("mask.png"), as WebDataset names a sample's second file; an empty cell
  // or null leaves the sample without it.
  std::vector<std::string> file_columns;
  // Every image field (by its kind: jpg, png, mask.png, ...) is checked as
  // the loader first reads it: the format by its first bytes, then the
  // header. One that fails (an empty file, an HTML page saved as .jpg, a GIF,
  // a cut header) is an error naming the sample and its file, since it
  // would fail in the training loop. With keep_bad_images such files are
  // stored as they are, counted and the first few named (PackSummary, the
  // index's note, `stoker inspect`). Damage past the header is found by
  // `stoker verify --decode`, not here.
  bool keep_bad_images = false;
};

struct PackSummary {
  std::uint64_t samples = 0;
  std::uint64_t shards = 0;
  std::uint64_t shard_bytes = 0;         // total size of the written shards
  std::uint64_t payload_bytes = 0;       // total size of the packed fields
  std::vector<std::string> class_names;  // label i is class_names[i], when labels came from names
  std::vector<std::string> warnings;     // e.g. files that were not images, skipped members
  std::string index_path;
  // With max_side: images re-encoded, and their bytes before and after.
  std::uint64_t images_reencoded = 0;
  std::uint64_t reencoded_bytes_before = 0;
  std::uint64_t reencoded_bytes_after = 0;
  // With seekable_jpeg: JPEGs re-written seekable, JPEGs kept as they were
  // (progressive, arithmetic, CMYK, undecodable), and the re-written ones'
  // bytes before and after.
  std::uint64_t seekable_jpegs = 0;
  std::uint64_t seekable_kept = 0;
  std::uint64_t seekable_bytes_before = 0;
  std::uint64_t seekable_bytes_after = 0;
  // With keep_bad_images: image fields kept that fail the header check, and
  // the first 1,000 ("<key>, field '<name>': <why>", the smallest keys; the
  // index's note keeps five).
  std::uint64_t bad_images_kept = 0;
  std::vector<std::string> bad_images_named;
  std::string note;  // what the index records (JSON), empty when pack changed and kept nothing
};

// Packs `source` into `out_dir` as shard-NNNNNN.tar files plus index.stoker.
// `source` is one of:
//  - a folder in ImageFolder layout (one sub-folder per class; labels are
//    the sorted class names' positions, as torchvision assigns them);
//  - a manifest, `.csv` (header row) or `.jsonl`, with a `path` column (the
//    field named by its extension), optional PackOptions::file_columns, an
//    optional `label` (integers, or class names mapped by sorted order), an
//    optional `key`, and any other columns as fields of their own: JSON
//    Lines strings as text, numbers as their text, objects, arrays and
//    booleans as JSON; CSV cells as text (empty cells and nulls left out).
//    The index records each field's kind (text, int, float, json; a file's
//    by its extension), which `inspect` shows and the loader checks specs
//    against.
//  - tar shards (a path or brace pattern ending in `.tar`, or a folder
//    holding `.tar` files and no sub-folders: its shards in name order),
//    repacked.
// Output is deterministic: the same input gives byte-identical files. Shards
// and the index are written under temporary names and renamed, the index
// last, so an interrupted pack never leaves a folder that opens as a dataset;
// a pack that fails removes the shards it wrote. Samples that come from a
// program rather than files: DatasetWriter (stoker/dataset_writer.h).
[[nodiscard]] Result<PackSummary> Pack(const std::string& source, const std::string& out_dir,
                                       const PackOptions& options = {});

struct IndexOptions {
  // Where to write the index; default: index.stoker beside the first shard.
  std::string output;
  bool overwrite = false;
  FileSystem* file_system = FileSystem::Default();
  // Called after each shard with (shards done, shards total); may be empty.
  std::function<void(std::uint64_t, std::uint64_t)> on_progress;
  // Every image field is checked as PackOptions::keep_bad_images says; one
  // that fails stops the index, named by shard:offset, unless kept (counted,
  // named, recorded in the index's note).
  bool keep_bad_images = false;
};

struct IndexSummary {
  std::uint64_t samples = 0;
  std::uint64_t shards = 0;
  std::uint64_t shard_bytes = 0;
  // Members left out as WebDataset leaves them out: no extension, links,
  // folders and other non-files, `__*__` names. Each is named in `warnings`.
  std::uint64_t skipped_members = 0;
  // JPEGs written with restart intervals (e.g. `jpegtran -restart`) whose
  // restart table went into the index, so the loader decodes only what a
  // crop keeps, as for `pack --seekable-jpeg`: intervals that divide the
  // image's MCU rows, at most 64 to a row.
  std::uint64_t seekable_payloads = 0;
  // With keep_bad_images: image fields kept that fail the header check, and
  // the first 1,000 ("<key>, field '<name>': <why>", the smallest keys; the
  // index's note keeps five).
  std::uint64_t bad_images_kept = 0;
  std::vector<std::string> bad_images_named;
  std::vector<std::string> warnings;
  std::string index_path;
};

// Builds the index for existing WebDataset shards. Each pattern may hold
// brace expressions (`data-{000000..000099}.tar`); a folder stands for the
// `.tar` files directly in it, in name order (InvalidArgument when it holds
// none). The index goes beside the first shard unless IndexOptions::output
// says otherwise. Members group into samples
// by WebDataset's rule, and the index holds exactly what the `webdataset`
// library yields: members it skips (no extension, links, folders, `__*__`)
// are left out, each named in a warning and counted (`inspect` shows the
// count). A field repeated in one sample, or a `.cls` that is not a decimal
// integer, is an error naming the shard, offset and key. A `jpg`/`jpeg`
// payload that already has restart intervals gets its restart table in the
// index (see IndexSummary::seekable_payloads); no payload is changed.
[[nodiscard]] Result<IndexSummary> IndexShards(const std::vector<std::string>& shard_patterns,
                                               const IndexOptions& options = {});

// What `stoker inspect --images N` shows, to choose pack's max_side and to
// see where decode="gpu" would decode each image: the JPEG headers of up to
// N samples spread evenly over the dataset (read, not decoded).
struct ImageSurvey {
  std::string field;                // the image field read: jpg, else jpeg
  std::uint64_t samples = 0;        // in the dataset
  std::uint64_t surveyed = 0;       // samples looked at
  std::uint64_t without_image = 0;  // of those, samples without the field
  struct Size {
    std::uint32_t width = 0, height = 0;  // as stored (the longest side does not depend on EXIF orientation)
  };
  std::vector<Size> sizes;  // one per JPEG whose header was read
  // How they are coded: "baseline 4:2:0", "progressive 4:4:4", "baseline CMYK", ... and how many.
  std::map<std::string, std::uint64_t> coding;
  // Where decode="gpu" would send them on a GPU with JPEG engines (A100,
  // H100, H200): the hardware decoder, nvJPEG's GPU decoder, or the CPU (by reason).
  std::uint64_t route_hardware = 0;
  std::uint64_t route_gpu = 0;
  std::map<std::string, std::uint64_t> route_cpu;
  // Headers that do not read as JPEG: how many, and the first 10 named
  // ("sample 'a/1' at shard-000000.tar:1536: ...", raw: print through Printable).
  std::uint64_t unreadable = 0;
  std::vector<std::string> unreadable_examples;
};
// InvalidArgument when the dataset has no jpg or jpeg field; read errors
// name the sample and shard:offset.
[[nodiscard]] Result<ImageSurvey> SurveyImages(const Dataset& dataset, std::uint64_t max_images = 1000);

// What pack's max_side would do to the surveyed images: the share it
// re-encodes, and the share of the pixels to decode that is left (decoding
// costs roughly in proportion, less where a crop lets the decoder scale).
struct MaxSideEffect {
  std::uint32_t max_side = 0;
  double images_reencoded = 0;  // 0-1
  double pixels_left = 1;       // 0-1
};
[[nodiscard]] MaxSideEffect EstimateMaxSide(const ImageSurvey& survey, std::uint32_t max_side);

}  // namespace stoker
