// stoker/loader.h: a native input pipeline that turns a packed dataset into
// batches of decoded, augmented, normalised images, in native threads.
//
// Order is a pure function of (seed, epoch): independent of thread count and
// timing, and exactly resumable from state() under the same global batch
// size, even with a different world size.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "stoker/augment.h"
#include "stoker/dataset.h"
#include "stoker/fields.h"
#include "stoker/loader_state.h"
#include "stoker/status.h"
#include "stoker/types.h"

namespace stoker {

// kShardBlockShuffle: shards in a random order, samples shuffled within
// windows of `shard_window` shards; each shard is read once per epoch, so a
// remote cache smaller than the data downloads each shard once per epoch.
// kAuto: kShuffle (a global shuffle) over local data and over a remote
// dataset whose cache holds all of it; kShardBlockShuffle when the cache is
// smaller, where a global shuffle would download shards over and over.
enum class Order : std::uint8_t { kSequential, kShuffle, kShardBlockShuffle, kAuto };
enum class CorruptPolicy : std::uint8_t {
  kError,  // stop with a message naming the key and shard:offset
  kSkip,   // count it and substitute the next good sample in the epoch order
};

// What happens to each image, with torchvision's semantics.
struct TransformOptions {
  enum class Kind : std::uint8_t {
    kRandomResizedCrop,  // train: RandomResizedCrop(size, scale, ratio) [+ RandomHorizontalFlip]
    kResizeCenterCrop,   // eval: Resize(resize) + CenterCrop(size)
    kNone,               // no crop stage: before_crop's steps end at the output size (RandomCrop, CenterCrop, Resize)
  };
  Kind kind = Kind::kRandomResizedCrop;
  int height = 224, width = 224;  // output size
  std::array<double, 2> scale = {0.08, 1.0};
  std::array<double, 2> ratio = {3.0 / 4.0, 4.0 / 3.0};
  double flip_probability = 0.5;  // 0 disables the flip
  int resize = 256;               // kResizeCenterCrop: the shorter side before cropping
  // The crop stage's resize (RandomResizedCrop's, or Resize's before
  // CenterCrop): Pillow's BILINEAR or BICUBIC, as torchvision asks it of PIL.
  enum class Interpolation : std::uint8_t { kBilinear, kBicubic };
  Interpolation interpolation = Interpolation::kBilinear;
  bool normalize = true;
  std::array<float, 3> mean = {0.485f, 0.456f, 0.406f};
  std::array<float, 3> std = {0.229f, 0.224f, 0.225f};
  DType dtype = DType::kFloat32;
  Layout layout = Layout::kNCHW;
  // Decode at 1/2, 1/4 or 1/8 resolution (DCT scaling) when the crop is at
  // least that many times the output size.
  bool dct_scaling = true;
  // Images with more pixels than this are refused as a bad sample
  // (Corruption, so CorruptPolicy::kSkip skips them) before any decoding:
  // a small file can claim a huge image. The default is PIL's limit
  // (2 x Image.MAX_IMAGE_PIXELS, about 179 megapixels); 0 means no limit.
  std::uint64_t max_pixels = 178'956'970;
  // Augmentation steps (stoker/augment.h), in order: before the crop on the
  // whole decoded image (which then cannot use region-of-interest decoding),
  // after the crop and flip on the output-sized image (they must keep its
  // size), and after normalisation on the output tensor (RandomErasing).
  // Each sample's steps draw from its own stream of (seed, epoch, sample),
  // apart from the crop's and flip's, so adding steps changes no crop.
  std::vector<TransformStep> before_crop, after_crop, after_normalize;
};

struct LoaderOptions {
  std::uint32_t batch_size = 64;  // per rank
  bool shuffle = true;
  Order order = Order::kAuto;  // used when shuffle is true
  // Order::kShardBlockShuffle: shards per window. 0: automatic, 8 for local
  // data; for a remote dataset the most of which three windows fit in its
  // cache (the one being read, the next, and the one downloading). A remote
  // cache that cannot hold 2 x window shards (read together at a window's
  // end) is refused at creation, naming the smallest cache that works.
  std::uint32_t shard_window = 0;
  std::uint64_t seed = 0;
  bool drop_last = false;
  // -1: from torchrun's RANK and WORLD_SIZE, else 0 and 1.
  int rank = -1;
  int world_size = -1;
  // Elastic training: 0 keeps batch_size per rank (global batch = batch_size
  // x world_size, an even split, the last partial batch padded by wrapping
  // around). Above 0, the global batch is this many samples whatever the
  // world size: rank r of W takes positions [floor(r*b/W), floor((r+1)*b/W))
  // of a global batch of b samples, so ranks differ by at most one sample,
  // nothing is padded (the epoch's last batch is short; a rank may get an
  // empty batch there) and every sample is read exactly once per epoch.
  // batch_size is then ignored; the buffers hold ceil(B / min_world_size).
  std::uint64_t global_batch_size = 0;
  // With global_batch_size: the smallest world size Reshard() may be given
  // (it sizes the batch buffers); 0 means the world size at creation.
  std::uint32_t min_world_size = 0;
  std::uint32_t threads = 0;  // 0: one per core; at most kMaxLoaderThreads
  // Batches prepared ahead; 0: automatic, threads / 4 + 1 within [2, 4], so
  // memory stays flat beyond 12 threads. At most kMaxPrefetch. The pool
  // holds prefetch + 2 batch buffers: those in flight, the one the consumer
  // uses, and a reserve for a consumer that keeps two or more; a loop that
  // holds one never touches the reserve's pages (page-locked buffers are
  // allocated when first used, so the same holds for them). Automatic, where a batch has 16 samples
  // or more per thread, batches are read that far ahead but decoded only
  // into buffers the loop has already used: a loop holding one batch at a
  // time touches two buffers (the one it holds and the next), a loop that
  // keeps more, or waits for a batch with no used buffer free, touches
  // another (LoaderStats::batch_buffers_touched). Set prefetch to have that
  // many batches decoded ahead whatever the memory.
  std::uint32_t prefetch = 0;
  TransformOptions transform;
  CorruptPolicy on_corrupt = CorruptPolicy::kError;
  // Typed fields (stoker/fields.h), delivered by Batch::fields() in this
  // order, except a `transformed` image, which fills Batch::images(). Empty:
  // images only, from image_field. A non-optional spec none of whose keys
  // the dataset has is refused at creation, naming the dataset's fields.
  std::vector<FieldSpec> fields;
  // Field holding the image; empty picks the first of jpg, jpeg, png, webp, tif, tiff, ppm, pgm
  // the sample has (PNG, WebP, TIFF, PGM and PPM are decoded whole, then cropped).
  std::string image_field;
  // Check every sample read against its index record (the xxh3 of its
  // fields, and its label against its .cls): a flipped byte in a shard or a
  // flipped label in the index is a Corruption error naming the sample, not
  // silently wrong data. Costs about 1% of the CPU time per image
  // (README: "Checks on read").
  bool verify_samples = true;
  // A seekable pack indexed with region records (index version 7, `stoker
  // pack --seekable-jpeg`): a RandomResizedCrop's image is read in part, its
  // head and only the MCU rows the crop covers (checked against the
  // record's per-row checks with verify_samples). False reads every JPEG
  // whole (the crop still entropy-decodes only its intervals).
  bool read_crop_rows = true;
  // The kernel's read-ahead on the shard files (local ones, or a remote
  // dataset's copies in its cache). kAuto switches it off
  // (POSIX_FADV_RANDOM: each read takes only the bytes asked for) for a
  // global shuffle over shards larger than the page cache can hold (its
  // room, measured at creation: MemAvailable, and each memory cgroup's
  // limit less its anonymous memory, less the loader's batch buffers),
  // where what the kernel reads ahead is evicted before use, and
  // keeps it otherwise; LoaderStats::readahead_note says why. The advice
  // applies to the dataset's shard files, for every loader that reads them.
  KernelReadahead kernel_readahead = KernelReadahead::kAuto;
  // The loader tunes its own active threads and prefetch depth while it
  // runs, to keep the consumer's wait in Next() under 2% of its time, with
  // as few threads as that takes. `threads` and `prefetch` (when set) are
  // where it starts (else 1 thread, prefetch 2). It never goes beyond
  // autotune_max_threads (0: one fewer than the cores, leaving the training
  // thread its own; at least 1) nor makes batch buffers beyond
  // autotune_memory_bytes (0: 1/8 of the machine's memory); each decision
  // is logged (Loader::AutotuneLog()).
  bool autotune = false;
  std::uint32_t autotune_max_threads = 0;
  std::uint64_t autotune_memory_bytes = 0;
};

inline constexpr std::uint32_t kMaxLoaderThreads = 1024;
inline constexpr std::uint32_t kMaxPrefetch = 64;
inline constexpr std::uint32_t kMaxBatchSize = 1u << 20;

struct LoaderStats {
  std::uint64_t batches = 0;
  std::uint64_t samples = 0;
  std::uint64_t bytes_read = 0;
  // Samples whose bytes were read (those of batches read ahead, and
  // substitutes, included): bytes_read / samples_read is the bytes read
  // per sample.
  std::uint64_t samples_read = 0;
  // Samples of delivered batches that were corrupt and replaced by the next
  // good one (CorruptPolicy::kSkip); each place in a batch counts once.
  std::uint64_t corrupt_skipped = 0;
  double wait_seconds = 0;         // consumer time blocked in Next()
  double read_seconds = 0;         // summed over threads
  double decode_seconds = 0;       // summed over threads
  double transform_seconds = 0;    // summed over threads
  double mean_ready_batches = 0;   // batches ready when Next() was called, averaged
  std::uint32_t threads = 0;       // active (with autotune: as tuned now)
  std::uint32_t shard_window = 0;  // in effect (Order::kShardBlockShuffle)
  Order order = Order::kShuffle;   // in effect (Order::kAuto resolved)
  // Remote datasets: the bytes epoch 0 is predicted to download (the cache's
  // eviction replayed over its shard visits), and what order was chosen and
  // why, with that prediction (a warning in words when it is over 1.5x the
  // dataset). Zero and empty for local data.
  std::uint64_t predicted_epoch_download_bytes = 0;
  std::string order_note;
  bool order_warning = false;
  // With CorruptPolicy::kError over a dataset that pack or index kept
  // images in that the loader cannot decode (--keep-bad-images): a warning
  // that the first one will stop it. Empty otherwise.
  std::string corrupt_note;
  std::uint32_t prefetch = 0;  // with autotune: as tuned now
  bool autotune = false;
  std::uint32_t autotune_changes = 0;
  std::uint64_t autotune_last_change_batch = 0;  // batches delivered when the tuner last changed something
  bool pinned_memory = false;                    // batch buffers are page-locked (CUDA present)
  // Batch buffers decoded into so far (of prefetch + 2): a loop holding one
  // batch at a time keeps this at 2 under an automatic prefetch depth.
  std::uint32_t batch_buffers_touched = 0;
  std::uint64_t read_requests = 0;  // after merging neighbouring samples
  std::string read_method;          // "io_uring" or "pread"
  // Seekable packs (`pack --seekable-jpeg`): samples whose crop was decoded
  // from only the restart intervals it covers, and samples whose restart
  // table disagreed with the JPEG (a shard edited after packing) and were
  // decoded whole instead: the pixels are right either way.
  std::uint64_t seekable_decodes = 0;
  std::uint64_t seekable_fallbacks = 0;
  // LoaderOptions::read_crop_rows: images read in part (the head and the
  // crop's MCU rows), and those of them read whole after all because the
  // rows read did not serve (a shard edited after packing): counted in
  // bytes_read either way.
  std::uint64_t seekable_part_reads = 0;
  std::uint64_t seekable_part_rereads = 0;
  // LoaderOptions::kernel_readahead as decided at creation, and why
  // (empty for loose files, read whole, where it does not apply).
  bool kernel_readahead = true;
  std::string readahead_note;

  // The counts and times accumulated since `earlier` (e.g. one epoch's);
  // mean_ready_batches and the configuration fields are kept as they are.
  [[nodiscard]] LoaderStats Since(const LoaderStats& earlier) const;
  // "80000 images in 41.2 s (1942 img/s, ...); consumer waited 0.3 s (0.7%); ..."
  [[nodiscard]] std::string Summary(double wall_seconds) const;
};

// What the per-sample transform did, in full-resolution source pixels.
struct TransformTrace {
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0;  // the source box resampled to the output size
  bool flipped = false;
  int decode_scale = 1;  // 1, 2, 4 or 8: DCT scaling used when decoding
  int source_width = 0, source_height = 0;
  std::vector<StepParams> steps;  // what each augmentation step used, in order
};

struct TransformedImage {
  std::vector<std::byte> data;  // height * width * 3 elements of the dtype, in the layout
  TransformTrace trace;
};

// Decodes `jpeg` and transforms it exactly as a Loader with this `seed` does
// for dataset sample `sample` in epoch `epoch` (same crop, same flip). For
// tests, and for looking at what the augmentation does.
[[nodiscard]] Result<TransformedImage> TransformImage(std::span<const std::byte> jpeg,
                                                      const TransformOptions& transform, std::uint64_t seed,
                                                      std::uint64_t epoch, std::uint64_t sample);

// The same for an encoded image (JPEG, PNG, WebP) or for RGB pixels, with
// the augmentation steps' parameters given instead of drawn (`replay`, one
// per step, as TransformTrace::steps reports them) when not null.
struct TransformInput {
  std::span<const std::byte> encoded;  // an encoded image, or (when empty)
  std::span<const std::uint8_t> rgb;   // height rows of width * 3 bytes
  int width = 0, height = 0;
  std::uint64_t seed = 0, epoch = 0, sample = 0;
  const std::vector<StepParams>* replay = nullptr;
  // The crop box (x0, y0, x1, y1, as TransformTrace reports it; whole
  // pixels for RandomResizedCrop) and flip to use instead of drawing them.
  std::optional<std::array<double, 4>> box;
  std::optional<bool> flip;
};
[[nodiscard]] Result<TransformedImage> TransformImage(const TransformInput& input, const TransformOptions& transform);

// The order a Loader reads `dataset` in during `epoch`, all ranks together,
// as dataset sample indices: kShuffle, kSequential, or kShardBlockShuffle
// with `shard_window` shards (0: 8). For measuring how close an order comes
// to a global shuffle (Python: stoker.order_quality). kAuto is refused:
// a Loader resolves it (LoaderStats::order, shard_window).
[[nodiscard]] Result<std::vector<std::uint64_t>> EpochSampleOrder(const Dataset& dataset, Order order,
                                                                  std::uint32_t shard_window, std::uint64_t seed,
                                                                  std::uint64_t epoch);

class Loader;

// A batch held by the consumer. Batch buffers are page-locked (cudaHostAlloc,
// found at run time) when a CUDA device is present, page-aligned otherwise. Its memory returns to the loader's pool
// when the Batch is destroyed (it must not outlive its Loader).
class Batch {
 public:
  Batch(Batch&&) noexcept;
  Batch& operator=(Batch&&) noexcept;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch();

  [[nodiscard]] void* images() const;  // [N, C, H, W] or [N, H, W, C] in dtype()
  [[nodiscard]] const std::int64_t* labels() const;
  [[nodiscard]] const std::uint64_t* indices() const;  // positions in the dataset index
  [[nodiscard]] std::uint32_t size() const;            // N: may be smaller at the epoch's end
  [[nodiscard]] std::array<std::int64_t, 4> shape() const;
  [[nodiscard]] DType dtype() const;
  // Bytes of images() in use: the finished batch (a DeviceLoader that
  // finishes on the GPU lays its own data out here).
  [[nodiscard]] std::size_t image_bytes() const;
  [[nodiscard]] std::uint64_t epoch() const;
  [[nodiscard]] std::uint64_t batch_index() const;  // within the epoch
  // LoaderOptions::fields, all but a transformed image, in their order:
  // field(i) holds size() values in batch order. None without fields.
  [[nodiscard]] std::size_t num_fields() const;
  [[nodiscard]] std::span<const FieldValue> field(std::size_t i) const;
  // Frees the memory field(i)'s values hold (their tensors and bytes), for
  // a consumer that has copied them out: they are empty afterwards, and
  // the batch's slot holds nothing of them while the copy is in use.
  void ReleaseField(std::size_t i);
  [[nodiscard]] const std::vector<FieldSpec>& field_specs() const;  // num_fields() of them
  // False where fields are given without a transformed image: images()
  // then holds nothing.
  [[nodiscard]] bool has_images() const;

 private:
  friend class Loader;
  Batch(Loader* loader, std::uint32_t slot) : loader_(loader), slot_(slot) {}
  Loader* loader_ = nullptr;
  std::uint32_t slot_ = 0;
};

class Loader {
 public:
  // The loader keeps `dataset` alive.
  [[nodiscard]] static Result<std::unique_ptr<Loader>> Create(std::shared_ptr<const Dataset> dataset,
                                                              const LoaderOptions& options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next batch of the current epoch, or nullopt at its end (call
  // SetEpoch or keep calling Next for the following epoch). Errors name the
  // sample key and shard:offset. Safe to call from several threads: calls
  // take turns, and each batch goes to exactly one caller. A forked child
  // cannot use its parent's loader (its threads did not survive the fork):
  // Next() says so instead of waiting forever.
  [[nodiscard]] Result<std::optional<Batch>> Next();
  // The same, waiting at most `timeout` for the batch: DeadlineExceeded
  // when it is not ready by then (call again; nothing is lost). For callers
  // that must stay responsive, such as Python checking for Ctrl-C.
  [[nodiscard]] Result<std::optional<Batch>> Next(std::chrono::nanoseconds timeout);
  // Starts epoch `epoch` from its beginning (drops prefetched work, except
  // when every batch of the current epoch was handed out and `epoch` is the
  // next one: the work running ahead into it is kept).
  void SetEpoch(std::uint64_t epoch);
  [[nodiscard]] std::uint64_t epoch() const;
  [[nodiscard]] std::uint64_t batches_per_epoch() const;
  // Samples this rank's batches hold an epoch (DistributedSampler's len():
  // the even split's padding included, drop_last's remainder not).
  [[nodiscard]] std::uint64_t samples_per_epoch() const;

  [[nodiscard]] LoaderState state() const;
  // Resumes at `state`: the next batch is the first not yet consumed. The
  // global batch size and sample count must match; the world size may differ.
  [[nodiscard]] Status Restore(const LoaderState& state);
  // Elastic training (needs global_batch_size): this process becomes rank
  // `rank` of `world_size` from the current position on, keeping its threads,
  // buffers and prefetched-order state; prefetched batches are dropped.
  // InvalidArgument when world_size is below the min_world_size the buffers
  // were sized for, or rank is out of range; FailedPrecondition without
  // global_batch_size (the even split's per-rank batch is fixed).
  [[nodiscard]] Status Reshard(std::uint32_t rank, std::uint32_t world_size);

  [[nodiscard]] LoaderStats stats() const;
  // With LoaderOptions::autotune: each decision, with the batch it was taken
  // at and why (the last 64); empty otherwise.
  [[nodiscard]] std::vector<std::string> AutotuneLog() const;
  [[nodiscard]] const LoaderOptions& options() const;
  // The capacity of each batch buffer (what Batch::images() may hold).
  [[nodiscard]] std::size_t batch_buffer_bytes() const;
  // Samples each batch buffer holds (batch_size, or the largest share of a
  // global batch any allowed world size gives).
  [[nodiscard]] std::uint32_t batch_capacity() const;
  [[nodiscard]] std::uint32_t rank() const;
  [[nodiscard]] std::uint32_t world_size() const;

  struct Impl;

  // Made by the library's factories (Impl is opaque outside it).
  explicit Loader(std::unique_ptr<Impl> impl);

 private:
  friend class Batch;
  void Release(std::uint32_t slot);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stoker
