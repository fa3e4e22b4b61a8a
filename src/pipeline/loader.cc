// The loader: one pool of native threads turns (batch slot, sample) work
// items into decoded, transformed images written straight into the batch's
// buffer; the consumer takes batches strictly in order.
#include "stoker/loader.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/cancel.h"
#include "core/host_buffer.h"
#include "core/mutex.h"
#include "device/preprocess_math.h"
#include "order/sampler.h"
#include "pipeline/image_pipeline.h"
#include "transform/transform.h"

namespace stoker {
namespace {

using Clock = std::chrono::steady_clock;

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  return (end != nullptr && *end == '\0' && x >= 0) ? static_cast<int>(x) : fallback;
}

// Per-thread scratch, reused for every sample: no allocation in steady state.
struct Scratch {
  std::vector<std::byte> encoded;
  ImageScratch image;
};

}  // namespace

struct Loader::Impl {
  struct Slot {
    HostBuffer images;
    std::vector<std::int64_t> labels;
    std::vector<std::uint64_t> indices;
    std::uint32_t size = 0;
    std::uint64_t epoch = 0;
    std::uint64_t batch_index = 0;
    std::uint32_t pending = 0;  // guarded by mu: samples not yet written
    Status error;               // guarded by mu: the first failure in this batch
    // Filled by the batch's read item, then read by its sample items.
    std::vector<std::uint64_t> positions;  // in the epoch order, one per sample
    std::vector<Result<SampleInfo>> infos;
    std::vector<Dataset::FieldRead> reads;
    std::vector<std::byte> encoded;  // the batch's compressed bytes, as read
  };
  // A batch's read (all its samples' bytes at once: coalesced, submitted
  // together), or one sample's decode + transform + write.
  enum class ItemKind : std::uint8_t { kReadBatch, kSample };
  struct WorkItem {
    ItemKind kind;
    std::uint32_t slot;
    std::uint32_t index;                                      // kSample: within the batch
    std::uint64_t position;                                   // kSample: in the epoch order
    std::shared_ptr<const std::vector<std::uint64_t>> order;  // that epoch's order
  };

  std::shared_ptr<const Dataset> dataset;
  LoaderOptions options;
  order::OrderSpec order_spec;
  order::BatchPlan plan;
  std::vector<order::ShardSpan> shard_spans;
  std::vector<std::size_t> image_fields;  // candidates present in the dataset, in preference order
  transform::OutputWriter writer{DType::kFloat32, Layout::kNCHW, true, {}, {}};
  std::size_t sample_bytes = 0;
  // finish_on_device: each slot's buffer is [ImageDesc x batch][pixels]; the
  // pixel area starts with one output-sized fallback image per sample, then
  // room for decoded crops handed out by an atomic cursor per slot.
  std::size_t desc_bytes = 0, fallback_bytes = 0, pixel_capacity = 0;
  std::unique_ptr<std::atomic<std::uint64_t>[]> pixel_used;
  std::size_t BatchBufferBytes() const {
    return options.finish_on_device ? desc_bytes + pixel_capacity : sample_bytes * options.batch_size;
  }
  std::uint32_t prefetch = 0;
  std::uint32_t threads = 0;

  Mutex mu;
  CondVar work_cv, done_cv;
  std::vector<Slot> slots;  // buffers are fixed; metadata guarded by mu
  std::vector<std::uint32_t> free_slots GUARDED_BY(mu);
  std::deque<WorkItem> queue GUARDED_BY(mu);
  std::deque<std::uint32_t> inflight GUARDED_BY(mu);  // scheduled batches, in order
  // Delivery: the epoch the consumer is in, and its next batch.
  std::uint64_t epoch GUARDED_BY(mu) = 0;
  std::uint64_t next_to_deliver GUARDED_BY(mu) = 0;
  // Scheduling runs ahead, across the end of an epoch into the next one, so
  // that a new epoch starts with batches ready.
  std::uint64_t schedule_epoch GUARDED_BY(mu) = 0;
  std::uint64_t next_to_schedule GUARDED_BY(mu) = 0;
  std::shared_ptr<const std::vector<std::uint64_t>> schedule_order GUARDED_BY(mu);
  bool stop GUARDED_BY(mu) = false;
  // Set with `stop`, read without the lock by what the workers wait on below
  // (a remote read waiting for its shard gives up instead of finishing).
  std::atomic<bool> cancelled{false};
  std::vector<std::jthread> workers;

  // Read-ahead hints for remote datasets: each planned epoch's shard visits
  // were appended to the planner at `base`; batch b's visits start at
  // base + batch_start[b - first]. The last three epochs planned (the
  // delivered one, the scheduled one and the one after).
  ShardReadPlanner* planner = nullptr;
  struct PlannedEpoch {
    std::uint64_t epoch = 0, base = 0;
    std::vector<std::uint64_t> batch_start;  // per batch from `first`, plus the end
    std::uint64_t first = 0;
  };
  std::deque<PlannedEpoch> planned GUARDED_BY(mu);

  std::uint32_t ShardOf(std::uint64_t sample) const {
    auto it = std::upper_bound(shard_spans.begin(), shard_spans.end(), sample,
                               [](std::uint64_t v, const order::ShardSpan& s) { return v < s.first_sample; });
    return static_cast<std::uint32_t>(it == shard_spans.begin() ? 0 : (it - shard_spans.begin()) - 1);
  }

  bool IsPlanned(std::uint64_t e) const REQUIRES(mu) {
    return std::any_of(planned.begin(), planned.end(), [&](const PlannedEpoch& p) { return p.epoch == e; });
  }

  // Announces the shard visits of `e` from batch `first` on, in read order,
  // and (plan_next) those of the following epoch, so that its first shards
  // arrive before it starts.
  void PlanEpoch(std::uint64_t e, std::uint64_t first, const std::vector<std::uint64_t>& order, bool plan_next = true)
      REQUIRES(mu) {
    if (planner == nullptr) return;
    if (!IsPlanned(e)) {
      PlannedEpoch p;
      p.epoch = e;
      p.first = first;
      std::vector<std::uint32_t> visits;
      std::vector<std::uint64_t> positions;
      for (std::uint64_t b = first; b < this->plan.NumBatches(); ++b) {
        p.batch_start.push_back(visits.size());
        this->plan.RankPositions(b, positions);
        for (std::uint64_t pos : positions) {
          const std::uint32_t shard = ShardOf(order[pos]);
          if (visits.empty() || visits.back() != shard) visits.push_back(shard);
        }
      }
      p.batch_start.push_back(visits.size());
      p.base = planner->AppendPlan(visits);
      planned.push_back(std::move(p));
      while (planned.size() > 3) planned.pop_front();
    }
    if (plan_next && !IsPlanned(e + 1))
      PlanEpoch(e + 1, 0, order::EpochOrder(order_spec, e + 1, shard_spans), /*plan_next=*/false);
  }

  // Reading has reached batch `b` of epoch `e` (delivery lags reading, so
  // nothing still to be read is treated as past).
  void AdvancePlan(std::uint64_t e, std::uint64_t b) REQUIRES(mu) {
    if (planner == nullptr) return;
    for (const auto& p : planned)
      if (p.epoch == e && b >= p.first && b - p.first < p.batch_start.size())
        planner->AdvancePlan(p.base + p.batch_start[b - p.first]);
  }

  // Stats: relaxed atomics, summed across threads.
  std::atomic<std::uint64_t> stat_batches{0}, stat_samples{0}, stat_bytes{0}, stat_skipped{0};
  std::atomic<std::uint64_t> read_ns{0}, decode_ns{0}, transform_ns{0}, wait_ns{0};
  std::atomic<std::uint64_t> ready_sum{0}, next_calls{0}, stat_requests{0}, stat_fallbacks{0};
  std::atomic<bool> read_method_known{false};
  mutable Mutex method_mu;
  std::string read_method GUARDED_BY(method_mu);

  std::string ImageFieldNames() const {
    std::vector<std::string> names;
    for (std::size_t f : image_fields) names.push_back(dataset->field_names()[f]);
    return fmt::format("{}", fmt::join(names, " or "));
  }

  // Restarts delivery and scheduling at batch `consumed` of epoch `e`; the
  // caller has drained in-flight work.
  void StartEpoch(std::uint64_t e, std::uint64_t consumed) REQUIRES(mu) {
    epoch = schedule_epoch = e;
    next_to_schedule = next_to_deliver = consumed;
    schedule_order = std::make_shared<const std::vector<std::uint64_t>>(order::EpochOrder(order_spec, e, shard_spans));
    if (planner != nullptr) {
      planner->ResetPlan();
      planned.clear();
      PlanEpoch(e, consumed, *schedule_order);
      AdvancePlan(e, consumed);
    }
  }

  void Schedule() REQUIRES(mu) {
    std::vector<std::uint64_t> positions;
    while (!free_slots.empty() && inflight.size() < prefetch) {
      if (next_to_schedule >= plan.NumBatches()) {
        // Run ahead into the next epoch (at most one epoch ahead of delivery).
        if (schedule_epoch > epoch) break;
        ++schedule_epoch;
        next_to_schedule = 0;
        schedule_order = std::make_shared<const std::vector<std::uint64_t>>(
            order::EpochOrder(order_spec, schedule_epoch, shard_spans));
        PlanEpoch(schedule_epoch, 0, *schedule_order);
      }
      const std::uint32_t s = free_slots.back();
      free_slots.pop_back();
      plan.RankPositions(next_to_schedule, positions);
      Slot& slot = slots[s];
      slot.size = static_cast<std::uint32_t>(positions.size());
      slot.epoch = schedule_epoch;
      slot.batch_index = next_to_schedule;
      slot.pending = slot.size;
      slot.error = Status::Ok();
      slot.positions.assign(positions.begin(), positions.end());
      if (options.finish_on_device) pixel_used[s].store(fallback_bytes, std::memory_order_relaxed);
      // Reads go ahead of the samples waiting to be decoded (after earlier
      // reads): a batch's samples can only start once it is read, and a read
      // queued behind the last batch's samples would leave the other threads
      // idle while it runs. This keeps the threads busy with few batches in
      // flight, so the pool (memory) need not grow with the thread count.
      const auto first_sample =
          std::find_if(queue.begin(), queue.end(), [](const WorkItem& w) { return w.kind != ItemKind::kReadBatch; });
      queue.insert(first_sample, {ItemKind::kReadBatch, s, 0, 0, schedule_order});
      inflight.push_back(s);
      ++next_to_schedule;
      // One read each: waking every worker per read only has them fight for
      // the lock the consumer needs.
      work_cv.NotifyOne();
    }
  }

  // Throws away scheduled work that no worker has started (for SetEpoch and
  // Restore), waits for the started items to finish, and recycles the slots.
  void Drain() REQUIRES(mu) {
    for (const auto& item : queue)
      slots[item.slot].pending -= item.kind == ItemKind::kReadBatch ? slots[item.slot].size : 1;
    queue.clear();
    done_cv.Wait(mu, [&]() REQUIRES(mu) {
      return std::all_of(inflight.begin(), inflight.end(), [&](std::uint32_t s) { return slots[s].pending == 0; });
    });
    for (std::uint32_t s : inflight) free_slots.push_back(s);
    inflight.clear();
  }

  void WorkerLoop() EXCLUDES(mu) {
    const CancelScope cancel_scope(&cancelled);
    Scratch scratch;
    mu.Lock();
    while (true) {
      work_cv.Wait(mu, [&]() REQUIRES(mu) { return stop || !queue.empty(); });
      if (stop) break;
      const WorkItem item = std::move(queue.front());
      queue.pop_front();
      const std::uint64_t item_epoch = slots[item.slot].epoch;
      if (item.kind == ItemKind::kReadBatch) {
        const std::uint32_t size = slots[item.slot].size;
        mu.Unlock();
        ReadBatch(item, *item.order);
        mu.Lock();
        // Its samples go behind reads already queued for later batches, so
        // reads run ahead of decoding.
        for (std::uint32_t i = 0; i < size; ++i)
          queue.push_back({ItemKind::kSample, item.slot, i, slots[item.slot].positions[i], item.order});
        work_cv.NotifyAll();
        continue;
      }
      mu.Unlock();
      Status status = ProduceSample(item, *item.order, item_epoch, scratch);
      mu.Lock();
      Slot& slot = slots[item.slot];
      if (!status.ok() && slot.error.ok()) slot.error = status;
      if (--slot.pending == 0) done_cv.NotifyAll();
    }
    mu.Unlock();
  }

  // The first image field `info` has, or nullopt.
  std::optional<std::size_t> ImageFieldOf(const SampleInfo& info) const {
    for (std::size_t f : image_fields)
      if (info.fields[f]) return f;
    return std::nullopt;
  }

  Status NoImageField(const SampleInfo& info) const {
    return Status::Corruption(fmt::format("sample '{}' in {} has no image field ({})", info.key,
                                          dataset->shards()[info.shard].path, ImageFieldNames()));
  }

  // Reads the image bytes of every sample of a batch into the slot's arena.
  // The slot's metadata vectors are this item's alone until its sample items
  // are queued.
  void ReadBatch(const WorkItem& item, const std::vector<std::uint64_t>& epoch_order) {
    const auto t0 = Clock::now();
    Slot& slot = slots[item.slot];
    const std::size_t n = slot.positions.size();
    slot.infos.clear();
    slot.reads.clear();
    for (std::size_t i = 0; i < n; ++i) slot.infos.push_back(dataset->Sample(epoch_order[slot.positions[i]]));
    std::vector<std::size_t> wanted;  // samples with something to read
    for (std::size_t i = 0; i < n; ++i) {
      Dataset::FieldRead read;
      if (slot.infos[i].ok()) {
        read.sample = &*slot.infos[i];
        if (auto field = ImageFieldOf(*read.sample)) {
          read.field = *field;
        } else {
          read.status = NoImageField(*read.sample);
        }
      } else {
        read.status = slot.infos[i].error();
      }
      slot.reads.push_back(read);
    }
    std::vector<Dataset::FieldRead> to_read;
    for (std::size_t i = 0; i < n; ++i)
      if (slot.reads[i].sample != nullptr && slot.reads[i].status.ok()) {
        wanted.push_back(i);
        to_read.push_back(slot.reads[i]);
      }
    stat_requests.fetch_add(dataset->ReadFields(to_read, slot.encoded), std::memory_order_relaxed);
    if (!read_method_known.exchange(true)) {
      MutexLock lock(method_mu);
      read_method = dataset->file_system()->ReadBatchMethod();
    }
    std::uint64_t bytes = 0;
    for (std::size_t k = 0; k < wanted.size(); ++k) {
      slot.reads[wanted[k]] = to_read[k];
      bytes += to_read[k].bytes.size();
    }
    stat_bytes.fetch_add(bytes, std::memory_order_relaxed);
    read_ns.fetch_add(static_cast<std::uint64_t>((Clock::now() - t0).count()), std::memory_order_relaxed);
  }

  // Reads, decodes and transforms the sample at `item.position`, substituting
  // following samples under CorruptPolicy::kSkip.
  Status ProduceSample(const WorkItem& item, const std::vector<std::uint64_t>& epoch_order, std::uint64_t item_epoch,
                       Scratch& scratch) {
    Slot& slot = slots[item.slot];
    const std::uint64_t n = epoch_order.size();
    constexpr int kMaxSubstitutes = 64;
    Status first_error;
    for (int attempt = 0; attempt <= kMaxSubstitutes; ++attempt) {
      const std::uint64_t sample = epoch_order[(item.position + static_cast<std::uint64_t>(attempt)) % n];
      // The finished image, or (finish_on_device) the sample's descriptor.
      auto* out = slot.images.data() + static_cast<std::size_t>(item.index) *
                                           (options.finish_on_device ? sizeof(device::ImageDesc) : sample_bytes);
      // The batch read fetched the first choice; substitutes are read here.
      Status s = attempt == 0
                     ? ProducePreRead(item.slot, item.index, sample, item_epoch, out, scratch)
                     : ProduceOne(sample, item_epoch, item.slot, item.index, out, slot.labels[item.index], scratch);
      if (s.ok()) {
        slot.indices[item.index] = sample;
        return Status::Ok();
      }
      if (options.on_corrupt == CorruptPolicy::kError || s.code() != StatusCode::kCorruption) return s;
      stat_skipped.fetch_add(1, std::memory_order_relaxed);
      if (first_error.ok()) first_error = s;
    }
    return first_error.WithContext(fmt::format("{} samples in a row are corrupt", kMaxSubstitutes + 1));
  }

  Status ProducePreRead(std::uint32_t slot_index, std::uint32_t index, std::uint64_t sample, std::uint64_t item_epoch,
                        std::byte* out, Scratch& scratch) {
    Slot& slot = slots[slot_index];
    const Dataset::FieldRead& read = slot.reads[index];
    if (!read.status.ok()) return read.status;
    const SampleInfo& info = *read.sample;
    slot.labels[index] = info.label;
    Status s = Finish(read.bytes, item_epoch, sample, slot_index, index, out, scratch);
    if (!s.ok()) return s.WithContext(Where(info, read.field));
    return Status::Ok();
  }

  // The per-sample work after reading: the finished image on the CPU, or
  // (finish_on_device) the decoded crop and its descriptor for the GPU.
  Status Finish(std::span<const std::byte> jpeg, std::uint64_t item_epoch, std::uint64_t sample,
                std::uint32_t slot_index, std::uint32_t index, std::byte* out, Scratch& scratch) {
    const TransformOptions& t = options.transform;
    if (!options.finish_on_device)
      return DecodeAndTransform(jpeg, t, writer, options.seed, item_epoch, sample, out, scratch.image, nullptr,
                                &decode_ns, &transform_ns);
    const auto t0 = Clock::now();
    DecodedCrop crop;
    STOKER_RETURN_IF_ERROR(DecodeCrop(jpeg, t, options.seed, item_epoch, sample, scratch.image, crop));
    const auto t1 = Clock::now();
    // `out` is this sample's descriptor; the batch's pixel area follows the table.
    std::byte* pixels = slots[slot_index].images.data() + desc_bytes;
    device::ImageDesc desc;
    desc.flip = crop.flip ? 1 : 0;
    // Only the box's pixels travel: the rectangle of whole pixels it touches.
    const int rx0 = std::max(0, static_cast<int>(std::floor(crop.x0)));
    const int ry0 = std::max(0, static_cast<int>(std::floor(crop.y0)));
    const int rx1 = std::min(crop.view.width, static_cast<int>(std::ceil(crop.x1)));
    const int ry1 = std::min(crop.view.height, static_cast<int>(std::ceil(crop.y1)));
    const std::uint64_t bytes = static_cast<std::uint64_t>(std::max(0, rx1 - rx0)) * std::max(0, ry1 - ry0) * 3;
    const std::uint64_t at = pixel_used[slot_index].fetch_add(bytes, std::memory_order_relaxed);
    if (bytes > 0 && at + bytes <= pixel_capacity) {
      const std::size_t row = static_cast<std::size_t>(rx1 - rx0) * 3;
      for (int y = ry0; y < ry1; ++y)
        std::memcpy(pixels + at + static_cast<std::size_t>(y - ry0) * row,
                    crop.view.data + static_cast<std::size_t>(y) * crop.view.stride + static_cast<std::size_t>(rx0) * 3,
                    row);
      desc.offset = at;
      desc.width = rx1 - rx0;
      desc.height = ry1 - ry0;
      desc.x0 = static_cast<float>(crop.x0 - rx0);
      desc.y0 = static_cast<float>(crop.y0 - ry0);
      desc.x1 = static_cast<float>(crop.x1 - rx0);
      desc.y1 = static_cast<float>(crop.y1 - ry0);
    } else {
      // No room left in this batch: resize here into the sample's own
      // output-sized fallback image; the GPU still flips and normalises.
      STOKER_RETURN_IF_ERROR(ResizeCrop(crop, t, scratch.image));
      stat_fallbacks.fetch_add(1, std::memory_order_relaxed);
      const std::size_t image = static_cast<std::size_t>(t.width) * t.height * 3;
      desc.offset = static_cast<std::uint64_t>(index) * image;
      std::memcpy(pixels + desc.offset, scratch.image.resized.data(), image);
      desc.width = t.width;
      desc.height = t.height;
      desc.x0 = desc.y0 = 0;
      desc.x1 = static_cast<float>(t.width);
      desc.y1 = static_cast<float>(t.height);
    }
    std::memcpy(out, &desc, sizeof(desc));
    decode_ns.fetch_add(static_cast<std::uint64_t>((t1 - t0).count()), std::memory_order_relaxed);
    transform_ns.fetch_add(static_cast<std::uint64_t>((Clock::now() - t1).count()), std::memory_order_relaxed);
    return Status::Ok();
  }

  std::string Where(const SampleInfo& info, std::size_t field) const {
    return fmt::format("sample '{}' (field '{}' at {}:{})", info.key, dataset->field_names()[field],
                       dataset->shards()[info.shard].path, info.fields[field]->offset);
  }

  Status ProduceOne(std::uint64_t sample, std::uint64_t item_epoch, std::uint32_t slot_index, std::uint32_t index,
                    std::byte* out, std::int64_t& label, Scratch& scratch) {
    auto t0 = Clock::now();
    STOKER_ASSIGN_OR_RETURN(SampleInfo info, dataset->Sample(sample));
    // The first image field this sample has (datasets may mix .jpg and .jpeg).
    const auto field = ImageFieldOf(info);
    if (!field) return NoImageField(info);
    const std::size_t image_field = *field;
    STOKER_RETURN_IF_ERROR(dataset->ReadFieldInto(info, image_field, scratch.encoded));
    stat_bytes.fetch_add(scratch.encoded.size(), std::memory_order_relaxed);
    label = info.label;
    auto t1 = Clock::now();
    read_ns.fetch_add(static_cast<std::uint64_t>((t1 - t0).count()), std::memory_order_relaxed);

    Status s = Finish(scratch.encoded, item_epoch, sample, slot_index, index, out, scratch);
    if (!s.ok()) return s.WithContext(Where(info, image_field));
    return Status::Ok();
  }
};

// --- Batch ---

Batch::Batch(Batch&& o) noexcept : loader_(std::exchange(o.loader_, nullptr)), slot_(o.slot_) {}
Batch& Batch::operator=(Batch&& o) noexcept {
  if (this != &o) {
    if (loader_) loader_->Release(slot_);
    loader_ = std::exchange(o.loader_, nullptr);
    slot_ = o.slot_;
  }
  return *this;
}
Batch::~Batch() {
  if (loader_) loader_->Release(slot_);
}
void* Batch::images() const {
  return loader_->impl_->slots[slot_].images.data();
}
const std::int64_t* Batch::labels() const {
  return loader_->impl_->slots[slot_].labels.data();
}
const std::uint64_t* Batch::indices() const {
  return loader_->impl_->slots[slot_].indices.data();
}
std::uint32_t Batch::size() const {
  return loader_->impl_->slots[slot_].size;
}
DType Batch::dtype() const {
  return loader_->impl_->options.transform.dtype;
}
std::uint64_t Batch::epoch() const {
  return loader_->impl_->slots[slot_].epoch;
}
std::uint64_t Batch::batch_index() const {
  return loader_->impl_->slots[slot_].batch_index;
}
std::size_t Batch::image_bytes() const {
  const auto& m = *loader_->impl_;
  if (!m.options.finish_on_device) return m.sample_bytes * size();
  return m.desc_bytes + std::min<std::uint64_t>(m.pixel_used[slot_].load(), m.pixel_capacity);
}
std::size_t Batch::device_pixels_offset() const {
  return loader_->impl_->desc_bytes;
}
std::array<std::int64_t, 4> Batch::shape() const {
  const auto& t = loader_->impl_->options.transform;
  if (t.layout == Layout::kNCHW) return {size(), 3, t.height, t.width};
  return {size(), t.height, t.width, 3};
}

// --- Loader ---

Loader::Loader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Loader::~Loader() {
  {
    MutexLock lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cancelled.store(true, std::memory_order_release);
  impl_->work_cv.NotifyAll();
  impl_->workers.clear();  // joins
}

Result<std::unique_ptr<Loader>> Loader::Create(std::shared_ptr<const Dataset> dataset, const LoaderOptions& options) {
  if (!dataset) return Status::InvalidArgument("Loader needs a dataset");
  auto impl = std::make_unique<Impl>();
  impl->dataset = dataset;
  impl->options = options;
  const auto& t = options.transform;
  if (options.batch_size == 0) return Status::InvalidArgument("batch_size must be positive");
  if (t.width <= 0 || t.height <= 0 || t.width > 16384 || t.height > 16384)
    return Status::InvalidArgument(fmt::format("output size {}x{} is out of range", t.width, t.height));
  if (!(t.scale[0] > 0 && t.scale[0] <= t.scale[1] && t.scale[1] <= 1))
    return Status::InvalidArgument(
        fmt::format("scale ({}, {}) must satisfy 0 < lo <= hi <= 1", t.scale[0], t.scale[1]));
  if (!(t.ratio[0] > 0 && t.ratio[0] <= t.ratio[1]))
    return Status::InvalidArgument(fmt::format("ratio ({}, {}) must satisfy 0 < lo <= hi", t.ratio[0], t.ratio[1]));
  if (t.kind == TransformOptions::Kind::kResizeCenterCrop && t.resize < std::max(t.width, t.height))
    return Status::InvalidArgument(
        fmt::format("resize {} is smaller than the crop {}x{}", t.resize, t.width, t.height));
  for (float sd : t.std)
    if (t.normalize && !(sd > 0)) return Status::InvalidArgument("normalize std must be positive");

  // Image fields.
  std::vector<std::string> candidates = options.image_field.empty() ? std::vector<std::string>{"jpg", "jpeg"}
                                                                    : std::vector<std::string>{options.image_field};
  for (const auto& c : candidates)
    if (auto f = dataset->FieldIndex(c)) impl->image_fields.push_back(*f);
  if (impl->image_fields.empty()) {
    return Status::InvalidArgument(fmt::format("dataset '{}' has no image field {} (its fields: {})",
                                               dataset->index_path(), fmt::join(candidates, " or "),
                                               fmt::join(dataset->field_names(), ", ")));
  }

  // Ranks.
  const int world = options.world_size >= 0 ? options.world_size : EnvInt("WORLD_SIZE", 1);
  const int rank = options.rank >= 0 ? options.rank : EnvInt("RANK", 0);
  impl->plan.num_samples = dataset->num_samples();
  impl->plan.world_size = static_cast<std::uint32_t>(std::max(world, 0));
  impl->plan.rank = static_cast<std::uint32_t>(std::max(rank, 0));
  impl->plan.global_batch = std::uint64_t{options.batch_size} * impl->plan.world_size;
  impl->plan.drop_last = options.drop_last;
  STOKER_RETURN_IF_ERROR(impl->plan.Validate());
  if (dataset->num_samples() == 0)
    return Status::InvalidArgument(fmt::format("dataset '{}' is empty", dataset->index_path()));

  impl->order_spec.seed = options.seed;
  impl->order_spec.shard_window = options.shard_window;
  if (options.shard_window == 0) {
    impl->order_spec.shard_window = 8;
    ShardReadPlanner* planner = dataset->file_system() ? dataset->file_system()->read_planner() : nullptr;
    if (planner != nullptr && planner->largest_shard_bytes() > 0) {
      // Near a window's end its shards are still being read while the next
      // window's start, and the one after should be downloading meanwhile:
      // three windows fit in the cache, or reads wait and shards are fetched twice.
      const std::uint64_t fit = planner->working_set_bytes() / (3 * planner->largest_shard_bytes());
      impl->order_spec.shard_window = static_cast<std::uint32_t>(std::clamp<std::uint64_t>(fit, 1, 64));
    }
  }
  impl->order_spec.mode = !options.shuffle                             ? order::OrderMode::kSequential
                          : options.order == Order::kShardBlockShuffle ? order::OrderMode::kShardBlockShuffle
                          : options.order == Order::kSequential        ? order::OrderMode::kSequential
                                                                       : order::OrderMode::kShuffle;
  for (const auto& s : dataset->shards()) impl->shard_spans.push_back({s.first_sample, s.num_samples});

  impl->writer = transform::OutputWriter(t.dtype, t.layout, t.normalize, t.mean, t.std);
  impl->sample_bytes = static_cast<std::size_t>(t.width) * t.height * 3 * transform::DTypeSize(t.dtype);
  if (options.finish_on_device) {
    if (!(options.device_input_factor >= 0 && options.device_input_factor <= 64))
      return Status::InvalidArgument(
          fmt::format("device_input_factor {} must be between 0 and 64", options.device_input_factor));
    const std::size_t image = static_cast<std::size_t>(t.width) * t.height * 3;
    impl->desc_bytes = (options.batch_size * sizeof(device::ImageDesc) + 63) / 64 * 64;
    impl->fallback_bytes = image * options.batch_size;
    // pixel_capacity counts from the start of the pixel area, fallback included.
    impl->pixel_capacity =
        impl->fallback_bytes + static_cast<std::size_t>(static_cast<double>(image) * options.batch_size *
                                                        static_cast<double>(options.device_input_factor));
  }
  impl->threads = options.threads ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  impl->prefetch = options.prefetch ? options.prefetch : std::clamp(impl->threads / 4 + 1, 2u, 4u);
  // The consumer may hold two batches (e.g. one in use, one being copied).
  const std::uint32_t pool = impl->prefetch + 2;
  impl->slots.resize(pool);
  impl->pixel_used = std::make_unique<std::atomic<std::uint64_t>[]>(pool);
  for (std::uint32_t i = 0; i < pool; ++i) {
    auto& slot = impl->slots[i];
    auto images = HostBuffer::Allocate(impl->BatchBufferBytes());
    if (!images.ok())
      return Status::ResourceExhausted(fmt::format("cannot allocate batch buffer {} of {} ({} bytes each): {}", i, pool,
                                                   impl->sample_bytes * options.batch_size, images.error().message()));
    slot.images = std::move(*images);
    slot.labels.resize(options.batch_size);
    slot.indices.resize(options.batch_size);
  }
  {
    MutexLock lock(impl->mu);
    for (std::uint32_t i = pool; i-- > 0;) impl->free_slots.push_back(i);
    impl->planner = dataset->file_system() ? dataset->file_system()->read_planner() : nullptr;
    impl->StartEpoch(0, 0);
  }
  Impl* raw = impl.get();
  for (std::uint32_t i = 0; i < impl->threads; ++i) impl->workers.emplace_back([raw] { raw->WorkerLoop(); });
  {
    // Start preparing the first batches now, while the caller builds its model.
    MutexLock lock(raw->mu);
    raw->Schedule();
  }
  return std::unique_ptr<Loader>(new Loader(std::move(impl)));
}

Result<std::optional<Batch>> Loader::Next() {
  Impl& m = *impl_;
  MutexLock lock(m.mu);
  if (m.next_to_deliver >= m.plan.NumBatches()) {
    // End of epoch: the next call delivers the following one, whose first
    // batches are already scheduled.
    ++m.epoch;
    m.next_to_deliver = 0;
    m.Schedule();
    return std::optional<Batch>();
  }
  m.Schedule();
  if (m.inflight.empty()) {
    // Every buffer is held by the consumer: waiting would never end.
    return Status::ResourceExhausted(fmt::format(
        "all {} batch buffers are still held by the consumer; release batches (or raise prefetch) before asking "
        "for more",
        m.slots.size()));
  }
  const std::uint32_t s = m.inflight.front();
  std::uint64_t ready = 0;
  for (std::uint32_t i : m.inflight) ready += m.slots[i].pending == 0;
  m.ready_sum.fetch_add(ready, std::memory_order_relaxed);
  m.next_calls.fetch_add(1, std::memory_order_relaxed);
  auto start = Clock::now();
  m.done_cv.Wait(m.mu, [&]() REQUIRES(m.mu) { return m.slots[s].pending == 0; });
  m.wait_ns.fetch_add(static_cast<std::uint64_t>((Clock::now() - start).count()), std::memory_order_relaxed);
  m.inflight.pop_front();
  ++m.next_to_deliver;
  m.AdvancePlan(m.epoch, m.next_to_deliver - 1);
  if (!m.slots[s].error.ok()) {
    Status error = m.slots[s].error;
    m.free_slots.push_back(s);
    m.Schedule();
    return error;
  }
  m.stat_batches.fetch_add(1, std::memory_order_relaxed);
  m.stat_samples.fetch_add(m.slots[s].size, std::memory_order_relaxed);
  m.Schedule();
  return std::optional<Batch>(Batch(this, s));
}

void Loader::Release(std::uint32_t slot) {
  MutexLock lock(impl_->mu);
  impl_->free_slots.push_back(slot);
  impl_->Schedule();
}

void Loader::SetEpoch(std::uint64_t epoch) {
  MutexLock lock(impl_->mu);
  if (impl_->epoch == epoch && impl_->next_to_deliver == 0) return;  // already at its start: keep the prefetch
  impl_->Drain();
  impl_->StartEpoch(epoch, 0);
}

std::uint64_t Loader::epoch() const {
  MutexLock lock(impl_->mu);
  return impl_->epoch;
}

std::uint64_t Loader::batches_per_epoch() const {
  return impl_->plan.NumBatches();
}

LoaderState Loader::state() const {
  MutexLock lock(impl_->mu);
  return {impl_->options.seed, impl_->epoch, impl_->plan.global_batch, impl_->next_to_deliver, impl_->plan.num_samples};
}

Status Loader::Restore(const LoaderState& state) {
  Impl& m = *impl_;
  if (state.num_samples != m.plan.num_samples) {
    return Status::InvalidArgument(fmt::format("loader state is for a dataset of {} samples, this one has {}",
                                               state.num_samples, m.plan.num_samples));
  }
  if (state.global_batch_size != m.plan.global_batch) {
    return Status::InvalidArgument(fmt::format(
        "loader state has global batch {} but this loader's is {} (batch_size x world_size must stay the same)",
        state.global_batch_size, m.plan.global_batch));
  }
  if (state.seed != m.options.seed)
    return Status::InvalidArgument(fmt::format("loader state has seed {}, this loader {}", state.seed, m.options.seed));
  if (state.batches_consumed > m.plan.NumBatches())
    return Status::InvalidArgument(fmt::format("loader state is past the end of the epoch ({} of {} batches)",
                                               state.batches_consumed, m.plan.NumBatches()));
  MutexLock lock(m.mu);
  m.Drain();
  m.StartEpoch(state.epoch, state.batches_consumed);
  return Status::Ok();
}

LoaderStats Loader::stats() const {
  const Impl& m = *impl_;
  LoaderStats s;
  s.batches = m.stat_batches.load();
  s.samples = m.stat_samples.load();
  s.bytes_read = m.stat_bytes.load();
  s.corrupt_skipped = m.stat_skipped.load();
  s.wait_seconds = static_cast<double>(m.wait_ns.load()) * 1e-9;
  s.read_seconds = static_cast<double>(m.read_ns.load()) * 1e-9;
  s.decode_seconds = static_cast<double>(m.decode_ns.load()) * 1e-9;
  s.transform_seconds = static_cast<double>(m.transform_ns.load()) * 1e-9;
  const auto calls = m.next_calls.load();
  s.mean_ready_batches = calls ? static_cast<double>(m.ready_sum.load()) / static_cast<double>(calls) : 0;
  s.threads = m.threads;
  s.prefetch = m.prefetch;
  s.shard_window = m.order_spec.shard_window;
  s.pinned_memory = !m.slots.empty() && m.slots[0].images.pinned();
  s.read_requests = m.stat_requests.load();
  s.device_fallbacks = m.stat_fallbacks.load();
  {
    MutexLock lock(m.method_mu);
    s.read_method = m.read_method;
  }
  return s;
}

std::size_t Loader::batch_buffer_bytes() const {
  return impl_->BatchBufferBytes();
}

const LoaderOptions& Loader::options() const {
  return impl_->options;
}
std::uint32_t Loader::rank() const {
  return impl_->plan.rank;
}
std::uint32_t Loader::world_size() const {
  return impl_->plan.world_size;
}

LoaderStats LoaderStats::Since(const LoaderStats& earlier) const {
  LoaderStats d = *this;
  d.batches -= earlier.batches;
  d.samples -= earlier.samples;
  d.bytes_read -= earlier.bytes_read;
  d.corrupt_skipped -= earlier.corrupt_skipped;
  d.wait_seconds -= earlier.wait_seconds;
  d.read_seconds -= earlier.read_seconds;
  d.decode_seconds -= earlier.decode_seconds;
  d.transform_seconds -= earlier.transform_seconds;
  d.read_requests -= earlier.read_requests;
  d.device_fallbacks -= earlier.device_fallbacks;
  return d;
}

std::string LoaderStats::Summary(double wall_seconds) const {
  const double busy = read_seconds + decode_seconds + transform_seconds;
  auto pct = [&](double x) { return busy > 0 ? 100.0 * x / busy : 0.0; };
  return fmt::format(
      "{} batches, {} images in {:.2f} s ({:.0f} img/s, {:.1f} MB/s read); consumer waited {:.2f} s ({:.1f}%); "
      "worker time: read {:.0f}%, decode {:.0f}%, transform {:.0f}%; {:.1f} of {} batches ready on average; "
      "{} corrupt skipped; {} read requests ({})",
      batches, samples, wall_seconds, wall_seconds > 0 ? samples / wall_seconds : 0.0,
      wall_seconds > 0 ? bytes_read / wall_seconds / 1e6 : 0.0, wait_seconds,
      wall_seconds > 0 ? 100.0 * wait_seconds / wall_seconds : 0.0, pct(read_seconds), pct(decode_seconds),
      pct(transform_seconds), mean_ready_batches, prefetch, corrupt_skipped, read_requests,
      read_method.empty() ? "none yet" : read_method);
}

}  // namespace stoker
