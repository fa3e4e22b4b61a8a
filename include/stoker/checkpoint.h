// stoker/checkpoint.h: checkpoints that do not stall training.
//
// Checkpointer::Save() copies the tensors into reusable host buffers (the
// snapshot, the only part training waits for) and returns; a background
// thread writes safetensors files, fsyncs them and their folder, and
// publishes the checkpoint atomically by renaming its folder into place.
//
// On disk, a checkpoint directory holds:
//   step-N/                      one published checkpoint, complete by construction
//     model.safetensors          or model-00001-of-0000K.safetensors + model.safetensors.index.json
//     manifest.json              per-file sizes and xxh3 checksums, loader state, RNG states, metadata
//   latest                       "step-N\n", replaced atomically after each publish
//   .lock                        held (flock) by the one Checkpointer writing here
//   .tmp-*                       a persist in progress; removed by the next Checkpointer::Open
// The format is specified in docs/checkpoint.md.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/file_system.h"
#include "stoker/loader_state.h"
#include "stoker/status.h"

namespace stoker {

// Element types of safetensors, by their names in the format ("BF16", ...).
enum class TensorDType : std::uint8_t {
  kBool,
  kUInt8,
  kInt8,
  kInt16,
  kUInt16,
  kInt32,
  kUInt32,
  kInt64,
  kUInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kComplex64,
  kFloat8E4M3,
  kFloat8E4M3Fnuz,
  kFloat8E5M2,
  kFloat8E5M2Fnuz,
  kFloat8E8M0,
};
// The safetensors name, e.g. "F8_E4M3".
[[nodiscard]] std::string_view TensorDTypeName(TensorDType dtype);
// Bytes per element.
[[nodiscard]] std::size_t TensorDTypeSize(TensorDType dtype);
// Parses a safetensors name; nullopt for unknown (and for the sub-byte F4/F6
// types, which stoker does not support).
[[nodiscard]] std::optional<TensorDType> ParseTensorDType(std::string_view name);

// A tensor to save, borrowed: `data` must hold product(shape) elements of
// `dtype`, contiguous, and stay unchanged until Save() returns.
struct TensorRef {
  std::string name;
  TensorDType dtype = TensorDType::kFloat32;
  std::vector<std::uint64_t> shape;
  const void* data = nullptr;
  // -1: host memory; N >= 0: memory of cuda:N, snapshotted with
  // asynchronous device-to-host copies into the (page-locked) snapshot
  // buffer. Work that writes the tensor must be complete (or ordered before
  // the call) when Save() starts; the Python package synchronises torch's
  // current stream first.
  int device = -1;
  // Sharded checkpoints (CheckpointOptions::world_size > 1): when set, this
  // is the piece [global_offsets, global_offsets + shape) of a tensor of
  // shape `global_shape` (same rank as `shape`); several ranks' pieces tile
  // it. Empty: the whole tensor. A rank's pieces of one name are stored as
  // "name@o0,o1,..." in its files; the manifest maps them back.
  std::vector<std::uint64_t> global_shape{};
  std::vector<std::uint64_t> global_offsets{};
};

// Everything saved beside the tensors (in manifest.json).
struct CheckpointExtras {
  std::optional<LoaderState> loader_state;
  // Opaque RNG states by name (e.g. "torch", "python"), as the caller encodes them.
  std::map<std::string, std::string> rng_states;
  // User metadata; also written as the safetensors __metadata__ of every file.
  std::map<std::string, std::string> metadata;
  // The value that "best" retention ranks by, if any.
  std::optional<double> metric;
  // Any JSON document, stored verbatim (the Python package keeps the state's
  // nested structure here). Empty: none. Checked by the background persist,
  // not by Save() (a state's structure can be megabytes): invalid JSON fails
  // that persist, reported by Wait() or the next Save(), and publishes nothing.
  std::string user_json;
};

enum class WhenBusy : std::uint8_t {
  kWait,  // Save() waits for the persist in flight, then snapshots
  kSkip,  // Save() returns at once without saving; counted in stats
};

enum class IntervalMode : std::uint8_t {
  kSteps,    // due every `every_steps` steps (step % every_steps == 0)
  kSeconds,  // due when `every_seconds` have passed since the last save
  kAuto,     // Young/Daly from the measured cost and `mtbf_seconds`
};

struct CheckpointOptions {
  std::string directory;
  // Keep the newest `keep_last` checkpoints (0: keep every checkpoint) ...
  std::uint32_t keep_last = 3;
  // ... and the best `keep_best` by CheckpointExtras::metric.
  std::uint32_t keep_best = 0;
  bool higher_metric_is_better = false;
  WhenBusy when_busy = WhenBusy::kWait;
  // Tensors are split across files of at most this many bytes of data (a
  // single larger tensor gets a file of its own).
  std::uint64_t max_file_bytes = std::uint64_t{4} << 30;
  IntervalMode interval_mode = IntervalMode::kSteps;
  std::uint64_t every_steps = 1000;
  // kSeconds: the interval; kAuto: the interval until a cost has been measured.
  double every_seconds = 1800;
  // kAuto: the mean time between failures of the job.
  double mtbf_seconds = 24 * 3600;
  // Threads that copy the snapshot (0: up to 4, one per core; at most 64).
  std::uint32_t copy_threads = 0;
  // Saving a step whose step-N folder exists already (say, after resuming
  // from an older checkpoint) replaces it only when set; otherwise Save()
  // refuses with AlreadyExists and the old folder stays.
  bool replace_existing = false;
  // nullptr: FileSystem::Default().
  FileSystem* file_system = nullptr;

  // Distributed jobs (world_size > 1): every rank opens a Checkpointer on
  // the same directory (a file system all of them see) and calls Save() for
  // the same steps with the same save_id; each writes only its own files
  // (rank-RRRRR*.safetensors and rank-RRRRR.json) into a shared temporary
  // folder, and rank 0 publishes step-N once every rank's files are durable,
  // writing the global manifest (docs/checkpoint.md, "Sharded checkpoints").
  // Which rank writes which tensor is the caller's choice (the Python
  // package spreads replicated tensors over the ranks). Retention and
  // cleanup of a failed save's leftovers are rank 0's.
  std::uint32_t rank = 0;
  std::uint32_t world_size = 1;
  // Rank 0 gives up publishing when some rank's files are not durable this
  // long after its own are (that rank died or hangs); the save fails and
  // the previous checkpoint stays the newest.
  double commit_timeout_seconds = 600;
  // Save() records where each tensor lies in the snapshot buffer, for
  // LastSnapshot() (the Python package's in-memory copies on a peer).
  bool describe_snapshots = false;
};

// One tensor of the last snapshot: its index in the span given to Save(),
// and its bytes in the snapshot buffer.
struct SnapshotTensor {
  std::size_t source = 0;
  std::span<const std::byte> data;
};

enum class SaveOutcome : std::uint8_t { kStarted, kSkippedBusy };

struct CheckpointStats {
  std::uint64_t saves_started = 0;
  std::uint64_t saves_published = 0;
  std::uint64_t saves_failed = 0;
  std::uint64_t skipped_busy = 0;    // WhenBusy::kSkip
  std::uint64_t waited_busy = 0;     // WhenBusy::kWait and a persist was still running
  double busy_wait_seconds = 0;      // time Save() spent waiting for the previous persist
  double last_stall_seconds = 0;     // the last Save() call, from entry to return
  double last_snapshot_seconds = 0;  // of which copying
  double last_persist_seconds = 0;   // snapshot taken -> published and durable
  std::uint64_t last_bytes = 0;      // tensor bytes of the last checkpoint
  std::uint64_t bytes_written = 0;   // files written, all checkpoints
  std::int64_t last_published_step = -1;
  bool pinned_snapshot = false;  // snapshot buffers are page-locked (a GPU is present)
  // The interval policy's current choice and the overhead it expects
  // (checkpoint cost plus expected lost work, as a fraction of run time).
  double interval_seconds = 0;
  double expected_overhead = 0;
};

class Checkpointer {
 public:
  // Creates the directory if needed, takes its lock (Unavailable if another
  // process holds it) and removes temporaries left by a crashed writer.
  [[nodiscard]] static Result<std::unique_ptr<Checkpointer>> Open(CheckpointOptions options);
  // Waits for the persist in flight.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Snapshots `tensors` and `extras` and returns; the persist runs in the
  // background. If the previous persist failed, returns its error (once) and
  // does not save. Names must be unique and non-empty. Sharded (world_size
  // > 1): `save_id` names this collective save, the same on every rank and
  // new for each save (letters, digits, '-' and '_').
  [[nodiscard]] Result<SaveOutcome> Save(std::int64_t step, std::span<const TensorRef> tensors,
                                         const CheckpointExtras& extras, std::string_view save_id = {});
  // Blocks until no persist is in flight; returns the error of a failed one.
  [[nodiscard]] Status Wait();
  // Whether a persist is in flight (a Save() now would wait or skip).
  [[nodiscard]] bool Busy() const;
  // Whether the last persist failed and the next Save() or Wait() will
  // return its error (sharded saves: the ranks agree to skip such a save).
  [[nodiscard]] bool Failed() const;
  // The last Save()'s snapshot (CheckpointOptions::describe_snapshots; empty
  // otherwise and before the first save), for keeping a copy elsewhere. The
  // bytes stay valid and unchanged until the next Save() begins (the
  // snapshot buffer is reused), whether or not the persist has finished:
  // the caller must not call Save() while it still reads them.
  [[nodiscard]] std::vector<SnapshotTensor> LastSnapshot() const;
  // Whether the interval policy wants a checkpoint at `step` now.
  [[nodiscard]] bool Due(std::int64_t step) const;
  [[nodiscard]] CheckpointStats stats() const;
  [[nodiscard]] const CheckpointOptions& options() const;

  struct Impl;

  // Made by the library's factories (Impl is opaque outside it).
  explicit Checkpointer(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

// A loaded tensor: a view into a private (copy-on-write) mapping of its file,
// owned by the LoadedCheckpoint. Writing to it never changes the file.
struct LoadedTensor {
  std::string name;
  TensorDType dtype = TensorDType::kFloat32;
  std::vector<std::uint64_t> shape;
  std::span<std::byte> data;
};

struct LoadedCheckpoint {
  std::int64_t step = 0;
  std::string path;  // the step-N folder
  CheckpointExtras extras;
  std::vector<LoadedTensor> tensors;  // in file order
  std::vector<std::unique_ptr<MappedFile>> mappings;
  // Checkpoints newer than this one that were skipped as corrupt, with why.
  std::vector<std::string> skipped;
};

struct LoadOptions {
  // Verify every file's xxh3 checksum (reads all bytes once).
  bool verify_checksums = true;
  // LoadLatestCheckpoint: on a corrupt newest checkpoint, fall back to the
  // previous complete one (and name what was skipped) instead of failing.
  bool skip_corrupt = false;
  FileSystem* file_system = nullptr;
};

// Loads one step-N folder, validating every safetensors rule and checksum.
[[nodiscard]] Result<LoadedCheckpoint> LoadCheckpoint(const std::string& step_directory,
                                                      const LoadOptions& options = {});
// The newest complete checkpoint in `directory`; NotFound when there is none.
[[nodiscard]] Result<LoadedCheckpoint> LoadLatestCheckpoint(const std::string& directory,
                                                            const LoadOptions& options = {});

// Loads one plain safetensors file from any writer (e.g. Hugging Face's),
// validating every rule; `step` is -1 and extras.metadata is its __metadata__.
[[nodiscard]] Result<LoadedCheckpoint> LoadSafetensorsFile(const std::string& path, FileSystem* file_system = nullptr);

struct CheckpointInfo {
  std::int64_t step = 0;
  std::string path;
  std::uint64_t bytes = 0;  // all files, from the manifest
  std::optional<double> metric;
};
// Published checkpoints (step-N folders with a readable manifest), oldest first.
[[nodiscard]] Result<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& directory,
                                                                  FileSystem* file_system = nullptr);

}  // namespace stoker
