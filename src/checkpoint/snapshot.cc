#include "checkpoint/snapshot.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>
#include <thread>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <fmt/format.h>

namespace stoker::checkpoint {
namespace {

struct CopySegment {
  std::byte* dst;
  const std::byte* src;
  std::uint64_t bytes;
};

// Copies with non-temporal stores where the CPU has them (x86-64's SSE2):
// the snapshot is written once and read back by the persist much later, so
// bringing its lines into the cache first (as memcpy's ordinary stores do
// below its non-temporal threshold, which a tensor of a few MiB stays under)
// only adds memory traffic. About 20% off the stall of a 256 MiB state.
// Small copies take memcpy. Callers fence (StoreFence) before handing over.
void CopyForSnapshot(std::byte* dst, const std::byte* src, std::uint64_t n) {
#if defined(__SSE2__)
  constexpr std::uint64_t kStreamFrom = 64 << 10;
  if (n >= kStreamFrom) {
    std::uint64_t i = 0;
    const std::uint64_t head = (16 - (reinterpret_cast<std::uintptr_t>(dst) & 15)) & 15;
    std::memcpy(dst, src, head);
    for (i = head; i + 64 <= n; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
    std::memcpy(dst + i, src + i, n - i);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

// Non-temporal stores are weakly ordered: they must be complete before
// another thread is told the copy is done.
void StoreFence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// Copies the segments with several threads: one core cannot saturate memory
// bandwidth.
void ParallelCopy(const std::vector<CopySegment>& segments, std::uint64_t total, std::uint32_t threads) {
  constexpr std::uint64_t kMinPerThread = std::uint64_t{32} << 20;
  threads = static_cast<std::uint32_t>(std::clamp<std::uint64_t>(total / kMinPerThread, 1, threads));
  auto copy_range = [&](std::uint64_t from, std::uint64_t to) {
    std::uint64_t pos = 0;
    for (const auto& s : segments) {
      const std::uint64_t begin = std::max(from, pos), end = std::min(to, pos + s.bytes);
      if (begin < end) CopyForSnapshot(s.dst + (begin - pos), s.src + (begin - pos), end - begin);
      pos += s.bytes;
      if (pos >= to) break;
    }
    StoreFence();
  };
  if (threads == 1) {
    copy_range(0, total);
    return;
  }
  std::vector<std::thread> workers;
  const std::uint64_t share = (total + threads - 1) / threads;
  for (std::uint32_t i = 1; i < threads; ++i)
    workers.emplace_back(copy_range, i * share, std::min(total, (i + 1) * share));
  copy_range(0, std::min(total, share));
  for (auto& w : workers) w.join();
}

std::string FileName(std::string_view stem, std::size_t index, std::size_t count) {
  if (count == 1) return fmt::format("{}.safetensors", stem);
  return fmt::format("{}-{:05d}-of-{:05d}.safetensors", stem, index + 1, count);
}

}  // namespace

std::string PieceKey(const TensorRef& t) {
  if (t.global_shape.empty()) return t.name;
  return fmt::format("{}@{}", t.name, fmt::join(t.global_offsets, ","));
}

static Status CheckPiece(const TensorRef& t) {
  if (t.global_shape.empty() && t.global_offsets.empty()) return Status::Ok();
  if (t.global_shape.size() != t.shape.size() || t.global_offsets.size() != t.shape.size())
    return Status::InvalidArgument(
        fmt::format("tensor '{}': a shard's shape [{}], global shape [{}] and offsets [{}] must have the same rank",
                    t.name, fmt::join(t.shape, ","), fmt::join(t.global_shape, ","), fmt::join(t.global_offsets, ",")));
  for (std::size_t d = 0; d < t.shape.size(); ++d) {
    if (t.global_offsets[d] > t.global_shape[d] || t.shape[d] > t.global_shape[d] - t.global_offsets[d])
      return Status::InvalidArgument(fmt::format(
          "tensor '{}': the shard at offsets [{}] of shape [{}] does not fit in the global shape [{}] (dimension {})",
          t.name, fmt::join(t.global_offsets, ","), fmt::join(t.shape, ","), fmt::join(t.global_shape, ","), d));
  }
  return Status::Ok();
}

Result<SnapshotPlan> PlanSnapshot(std::span<const TensorRef> tensors, std::uint64_t max_file_bytes, SnapshotPlan reuse,
                                  std::string_view file_stem) {
  // The training loop waits for this, and states hold tens of thousands of
  // tensors: one validating pass, one sort by name (which also brings
  // duplicates together), one stable pass by element size.
  std::vector<std::uint64_t> bytes(tensors.size());
  std::vector<std::size_t> by_name(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorRef& t = tensors[i];
    if (t.name.empty()) return Status::InvalidArgument(fmt::format("tensor {} has an empty name", i));
    if (t.name == "__metadata__") return Status::InvalidArgument("a tensor may not be named '__metadata__'");
    STOKER_RETURN_IF_ERROR(CheckPiece(t));
    auto b = safetensors::TensorBytes(t.dtype, t.shape);
    if (!b.ok()) return b.error().WithContext(fmt::format("tensor '{}'", t.name));
    if (*b > 0 && t.data == nullptr) return Status::InvalidArgument(fmt::format("tensor '{}' has no data", t.name));
    bytes[i] = *b;
    by_name[i] = i;
  }
  // Pieces of sharded tensors are stored under "name@offsets" (a rank may
  // hold several pieces of one tensor); keys are made only when there are any.
  std::vector<std::string> keys;
  if (std::any_of(tensors.begin(), tensors.end(), [](const TensorRef& t) { return !t.global_shape.empty(); })) {
    keys.reserve(tensors.size());
    for (const TensorRef& t : tensors) keys.push_back(PieceKey(t));
  }
  auto key = [&](std::size_t i) -> const std::string& { return keys.empty() ? tensors[i].name : keys[i]; };
  std::sort(by_name.begin(), by_name.end(), [&](std::size_t a, std::size_t b) { return key(a) < key(b); });
  for (std::size_t k = 1; k < by_name.size(); ++k)
    if (key(by_name[k]) == key(by_name[k - 1]))
      return Status::InvalidArgument(fmt::format(
          "duplicate tensor name '{}': two tensors of the state have it (a nested state flattens {{\"a.b\": x, \"a\": "
          "{{\"b\": y}}}} to two 'a.b'); rename one",
          key(by_name[k])));
  // By element size (largest first) then name: every tensor aligned to its
  // element size in the file, and the same files whatever order the state
  // listed its tensors in.
  std::vector<std::size_t> element_size(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) element_size[i] = TensorDTypeSize(tensors[i].dtype);
  std::vector<std::size_t> order = std::move(by_name);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return element_size[a] > element_size[b]; });
  // Fill each file up to max_file_bytes in that order.
  std::vector<std::vector<std::size_t>> groups;
  std::uint64_t in_group = 0;
  for (std::size_t i : order) {
    if (groups.empty() || (in_group > 0 && in_group + bytes[i] > max_file_bytes)) {
      groups.emplace_back();
      in_group = 0;
    }
    groups.back().push_back(i);
    in_group += bytes[i];
  }
  if (groups.empty()) groups.emplace_back();  // an empty state still makes one (empty) file
  // Assigned into `reuse`'s entries: their strings and vectors keep their
  // capacity, so that a steady-state save allocates nothing per tensor.
  SnapshotPlan plan = std::move(reuse);
  plan.files.resize(groups.size());
  plan.tensor_bytes = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    FilePlan& file = plan.files[g];
    file.name = FileName(file_stem, g, groups.size());
    file.arena_offset = plan.tensor_bytes;
    file.bytes = 0;
    file.tensors.resize(groups[g].size());
    file.sources.assign(groups[g].begin(), groups[g].end());
    for (std::size_t k = 0; k < groups[g].size(); ++k) {
      const TensorRef& t = tensors[groups[g][k]];
      safetensors::TensorLayout& layout = file.tensors[k];
      layout.name.assign(key(groups[g][k]));
      layout.dtype = t.dtype;
      layout.shape.assign(t.shape.begin(), t.shape.end());
      layout.begin = file.bytes;
      layout.end = file.bytes + bytes[groups[g][k]];
      file.bytes = layout.end;
    }
    plan.tensor_bytes += file.bytes;
  }
  return plan;
}

Status SnapshotCopier::CheckDevices(std::span<const TensorRef> tensors) {
  for (const TensorRef& t : tensors) {
    if (t.device < 0) continue;
    if (runtime_ == nullptr) runtime_ = device::CudaDeviceRuntime(&unavailable_);
    if (runtime_ == nullptr)
      return Status::Unavailable(
          fmt::format("tensor '{}' is on cuda:{} but CUDA is not usable here: {}", t.name, t.device, unavailable_));
  }
  return Status::Ok();
}

Status SnapshotCopier::Copy(const SnapshotPlan& plan, std::span<const TensorRef> tensors, HostBuffer& arena) {
  std::vector<CopySegment> segments;
  std::uint64_t host_total = 0;
  std::set<int> devices_used;
  std::optional<int> caller_device;
  auto restore_device = [&]() -> Status { return caller_device ? runtime_->SetDevice(*caller_device) : Status::Ok(); };
  for (const FilePlan& file : plan.files) {
    for (std::size_t k = 0; k < file.tensors.size(); ++k) {
      const TensorRef& t = tensors[file.sources[k]];
      const std::uint64_t bytes = file.tensors[k].end - file.tensors[k].begin;
      std::byte* dst = arena.data() + file.arena_offset + file.tensors[k].begin;
      if (bytes == 0) continue;
      if (t.device < 0) {
        segments.push_back({dst, static_cast<const std::byte*>(t.data), bytes});
        host_total += bytes;
        continue;
      }
      // Device tensors: enqueued first, so they run while the host copies do.
      device::DeviceRuntime& rt = *runtime_;
      if (!caller_device) {
        STOKER_ASSIGN_OR_RETURN(caller_device, rt.CurrentDevice());
      }
      if (Status s = rt.SetDevice(t.device); !s.ok()) return s.WithContext(fmt::format("tensor '{}'", t.name));
      auto stream = streams_.find(t.device);
      if (stream == streams_.end()) {
        STOKER_ASSIGN_OR_RETURN(auto made, device::MakeStream(rt));
        stream = streams_.emplace(t.device, std::move(made)).first;
      }
      if (Status s = rt.CopyToHostAsync(dst, t.data, bytes, stream->second.get()); !s.ok()) {
        (void)restore_device();
        return s.WithContext(fmt::format("snapshot of tensor '{}' on cuda:{}", t.name, t.device));
      }
      devices_used.insert(t.device);
    }
  }
  ParallelCopy(segments, host_total, copy_threads_);
  for (int d : devices_used) {
    if (Status s = runtime_->SynchronizeStream(streams_.at(d).get()); !s.ok()) {
      (void)restore_device();
      return s.WithContext(fmt::format("snapshot from cuda:{}", d));
    }
  }
  return restore_device();
}

}  // namespace stoker::checkpoint
