// Reading sharded checkpoints: the manifest's pieces, and any region of a
// tensor copied from the pieces it overlaps, reading (and checking) only
// the blocks of the files those bytes lie in.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <numeric>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "checkpoint/manifest.h"
#include "checkpoint/sharded_manifest.h"
#include "core/hash.h"
#include "stoker/sharded_checkpoint.h"

namespace stoker {
namespace {

struct FileEntry {
  std::string name;
  std::uint64_t bytes = 0;
  std::uint64_t xxh3 = 0;  // of the whole file
  std::vector<std::uint64_t> blocks;
  std::once_flag opened;
  std::unique_ptr<ReadableFile> file;
  Status open_error;
};

// Reads that are hashed as they land: small enough to stay in a core's L2.
constexpr std::size_t kHashedReadBytes = 256 << 10;

// One thread's last block read into memory, kept across requests: pieces
// that follow each other in a file often share a block.
struct BlockCache {
  const FileEntry* file = nullptr;
  std::uint64_t block = ~std::uint64_t{0};
  std::uint64_t loaded = 0;
  std::vector<std::byte> buffer;
};

std::uint64_t Volume(std::span<const std::uint64_t> shape) {
  return std::accumulate(shape.begin(), shape.end(), std::uint64_t{1}, std::multiplies<>());
}

// A request, checked: its tensor, and the box it wants.
struct Region {
  const ShardedTensorInfo* tensor = nullptr;
  std::vector<std::uint64_t> offsets, shape;
  std::span<std::byte> out;
  [[nodiscard]] bool Overlaps(const ShardPiece& p) const;
};

}  // namespace

struct ShardedCheckpoint::Impl {
  std::shared_ptr<FileSystem> owned_fs;  // a remote one, kept alive with the checkpoint
  FileSystem* fs = nullptr;
  bool verify = true;
  bool local = false;  // files of the local file system (read in pieces that stay in cache while hashed)
  std::string path;
  std::int64_t step = 0;
  checkpoint::ShardedLayout layout;
  std::unordered_map<std::string_view, std::size_t> by_name;
  std::unordered_map<std::string, std::unique_ptr<FileEntry>> files;
  std::atomic<std::uint64_t> bytes_read{0};
  std::atomic<std::uint64_t> blocks_checked{0};

  Result<ReadableFile*> Open(FileEntry& f) {
    std::call_once(f.opened, [&] {
      auto opened = fs->OpenForRead(path + "/" + f.name);
      if (opened.ok()) {
        f.file = std::move(*opened);
      } else {
        f.open_error = opened.error().WithContext(fmt::format("sharded checkpoint '{}'", path));
      }
    });
    if (!f.open_error.ok()) return f.open_error;
    return f.file.get();
  }

  Result<Region> Validate(const RegionRequest& request) const;
  // Copies the part of region `r` that piece `p` holds.
  Status CopyPiece(const Region& r, const ShardPiece& p, BlockCache& cache);
};

// A cursor over one file's blocks: reads a block, checks it, and serves
// the ranges inside it; the requests' ranges come in ascending order.
class BlockCursor {
 public:
  BlockCursor(ShardedCheckpoint::Impl& m, FileEntry& f, ReadableFile& file, BlockCache& cache, std::string_view tensor)
      : m_(m), f_(f), file_(file), cache_(cache), tensor_(tensor) {
    if (cache_.file != &f_) {
      cache_.file = &f_;
      cache_.block = ~std::uint64_t{0};
    }
  }

  // Copies file bytes [offset, offset + out.size()) into `out`.
  Status Copy(std::uint64_t offset, std::span<std::byte> out) {
    const std::uint64_t block_bytes = m_.layout.block_bytes;
    while (!out.empty()) {
      const std::uint64_t block = offset / block_bytes;
      const std::uint64_t begin = block * block_bytes;
      if (block != cache_.block && offset == begin && block < f_.blocks.size() && begin < f_.bytes &&
          out.size() >= std::min(block_bytes, f_.bytes - begin)) {
        // The whole block lands in `out`: read and check it there, no copy.
        const std::size_t n = static_cast<std::size_t>(std::min(block_bytes, f_.bytes - begin));
        STOKER_RETURN_IF_ERROR(Check(block, begin, out.first(n)));
        out = out.subspan(n);
        offset += n;
        continue;
      }
      if (block != cache_.block) STOKER_RETURN_IF_ERROR(Load(block));
      const std::uint64_t in_block = offset - block * block_bytes;
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(out.size(), cache_.loaded - in_block));
      std::memcpy(out.data(), cache_.buffer.data() + in_block, n);
      out = out.subspan(n);
      offset += n;
    }
    return Status::Ok();
  }

 private:
  // Reads block `block` (starting at byte `begin`) into `into` and checks it.
  Status Check(std::uint64_t block, std::uint64_t begin, std::span<std::byte> into) {
    std::uint64_t sum = 0;
    if (m_.verify && m_.local) {
      // Hashed piece by piece as each is read, while it is still in the
      // core's L2: hashing the 4 MiB block after reading it was a second
      // pass through the slower caches. Remote files are read whole: a read
      // may be a request.
      Xxh3Stream hash;
      for (std::size_t at = 0; at < into.size(); at += kHashedReadBytes) {
        const auto piece = into.subspan(at, std::min(kHashedReadBytes, into.size() - at));
        STOKER_RETURN_IF_ERROR(file_.ReadExactAt(begin + at, piece));
        hash.Update(piece);
      }
      sum = hash.Digest();
    } else {
      STOKER_RETURN_IF_ERROR(file_.ReadExactAt(begin, into));
      if (m_.verify) sum = Xxh3(into);
    }
    m_.bytes_read.fetch_add(into.size(), std::memory_order_relaxed);
    if (!m_.verify) return Status::Ok();
    m_.blocks_checked.fetch_add(1, std::memory_order_relaxed);
    if (sum != f_.blocks[block])
      return Status::Corruption(fmt::format(
          "'{}/{}' block {} (bytes {}..{}) fails its xxh3 checksum (reading tensor '{}'): the file changed after "
          "it was written",
          m_.path, f_.name, block, begin, begin + into.size(), tensor_));
    return Status::Ok();
  }

  Status Load(std::uint64_t block) {
    const std::uint64_t block_bytes = m_.layout.block_bytes;
    const std::uint64_t begin = block * block_bytes;
    if (block >= f_.blocks.size() || begin >= f_.bytes)
      return Status::Corruption(fmt::format("'{}/{}': tensor '{}' points past the end of the file ({} bytes)", m_.path,
                                            f_.name, tensor_, f_.bytes));
    const std::uint64_t n = std::min(block_bytes, f_.bytes - begin);
    cache_.buffer.resize(static_cast<std::size_t>(block_bytes));
    cache_.block = ~std::uint64_t{0};  // (until it is checked)
    STOKER_RETURN_IF_ERROR(Check(block, begin, std::span(cache_.buffer.data(), static_cast<std::size_t>(n))));
    cache_.block = block;
    cache_.loaded = n;
    return Status::Ok();
  }

  ShardedCheckpoint::Impl& m_;
  FileEntry& f_;
  ReadableFile& file_;
  BlockCache& cache_;
  std::string_view tensor_;
};

Result<Region> ShardedCheckpoint::Impl::Validate(const RegionRequest& request) const {
  const auto found = by_name.find(request.name);
  if (found == by_name.end())
    return Status::InvalidArgument(fmt::format("sharded checkpoint '{}' has no tensor '{}'", path, request.name));
  Region r;
  r.tensor = &layout.tensors[found->second];
  r.out = request.out;
  const ShardedTensorInfo& t = *r.tensor;
  const std::size_t ndim = t.shape.size();
  r.offsets.assign(request.offsets.begin(), request.offsets.end());
  r.shape.assign(request.shape.begin(), request.shape.end());
  if (r.offsets.empty()) r.offsets.assign(ndim, 0);
  if (r.shape.empty()) r.shape = t.shape;
  if (r.offsets.size() != ndim || r.shape.size() != ndim)
    return Status::InvalidArgument(
        fmt::format("tensor '{}' has {} dimensions; the region asked for has {}", t.name, ndim, r.shape.size()));
  for (std::size_t d = 0; d < ndim; ++d)
    if (r.offsets[d] > t.shape[d] || r.shape[d] > t.shape[d] - r.offsets[d])
      return Status::InvalidArgument(fmt::format(
          "the region at [{}] of shape [{}] does not fit in tensor '{}' of shape [{}] (a target shard laid out for "
          "another model?)",
          fmt::join(r.offsets, ","), fmt::join(r.shape, ","), t.name, fmt::join(t.shape, ",")));
  const std::uint64_t element = TensorDTypeSize(t.dtype);
  if (request.out.size() != Volume(r.shape) * element)
    return Status::InvalidArgument(fmt::format("tensor '{}': the region [{}] of {} needs {} bytes; the buffer has {}",
                                               t.name, fmt::join(r.shape, ","), TensorDTypeName(t.dtype),
                                               Volume(r.shape) * element, request.out.size()));
  return r;
}

bool Region::Overlaps(const ShardPiece& p) const {
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (std::max(offsets[d], p.offsets[d]) >= std::min(offsets[d] + shape[d], p.offsets[d] + p.shape[d])) return false;
  return true;
}

Status ShardedCheckpoint::Impl::CopyPiece(const Region& r, const ShardPiece& p, BlockCache& buffer) {
  const ShardedTensorInfo& t = *r.tensor;
  const std::size_t ndim = t.shape.size();
  const std::uint64_t element = TensorDTypeSize(t.dtype);
  FileEntry& f = *files.at(p.file);
  STOKER_ASSIGN_OR_RETURN(ReadableFile * file, Open(f));
  BlockCursor cursor(*this, f, *file, buffer, t.name);
  if (ndim == 0) return cursor.Copy(p.begin, r.out);
  const auto& offsets = r.offsets;
  const auto& shape = r.shape;
  std::vector<std::uint64_t> lo(ndim), hi(ndim), index(ndim);
  for (std::size_t d = 0; d < ndim; ++d) {
    lo[d] = std::max(offsets[d], p.offsets[d]);
    hi[d] = std::min(offsets[d] + shape[d], p.offsets[d] + p.shape[d]);
  }
  // Runs: the innermost dimensions the intersection covers fully in both
  // the piece and the region merge into one contiguous copy.
  std::size_t k = ndim - 1;
  while (k > 0 && hi[k] - lo[k] == p.shape[k] && hi[k] - lo[k] == shape[k]) --k;
  std::uint64_t run = (hi[k] - lo[k]) * element;
  for (std::size_t d = k + 1; d < ndim; ++d) run *= hi[d] - lo[d];
  // Walk the outer dimensions [0, k) of the intersection in row-major order.
  std::copy(lo.begin(), lo.end(), index.begin());
  for (;;) {
    std::uint64_t src = 0, dst = 0;
    for (std::size_t d = 0; d < ndim; ++d) {
      src = src * p.shape[d] + (index[d] - p.offsets[d]);
      dst = dst * shape[d] + (index[d] - offsets[d]);
    }
    STOKER_RETURN_IF_ERROR(cursor.Copy(p.begin + src * element, r.out.subspan(static_cast<std::size_t>(dst * element),
                                                                              static_cast<std::size_t>(run))));
    std::size_t d = k;
    while (d > 0) {
      --d;
      if (++index[d] < hi[d]) break;
      index[d] = lo[d];
      if (d == 0) return Status::Ok();
    }
    if (k == 0) return Status::Ok();
  }
}

ShardedCheckpoint::ShardedCheckpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShardedCheckpoint::~ShardedCheckpoint() = default;

Result<std::unique_ptr<ShardedCheckpoint>> ShardedCheckpoint::Open(const std::string& step_directory,
                                                                   const LoadOptions& options) {
  return Open(step_directory, options, nullptr);
}

Result<std::unique_ptr<ShardedCheckpoint>> ShardedCheckpoint::Open(const std::string& step_directory_in,
                                                                   const LoadOptions& options,
                                                                   std::shared_ptr<FileSystem> file_system) {
  auto m = std::make_unique<Impl>();
  m->owned_fs = std::move(file_system);
  m->fs = options.file_system ? options.file_system : FileSystem::Default();
  m->verify = options.verify_checksums;
  m->local = m->fs == FileSystem::Default();
  m->path = step_directory_in;
  while (m->path.size() > 1 && m->path.back() == '/') m->path.pop_back();
  STOKER_ASSIGN_OR_RETURN(checkpoint::Manifest manifest, checkpoint::ReadManifest(*m->fs, m->path));
  if (manifest.sharded_json.empty())
    return Status::FailedPrecondition(
        fmt::format("'{}' is a checkpoint of one process, not a sharded one: load it with LoadCheckpoint", m->path));
  const std::string where = m->path + "/" + std::string(checkpoint::kManifestName);
  STOKER_ASSIGN_OR_RETURN(m->layout, checkpoint::DecodeShardedLayout(manifest.sharded_json, where));
  m->step = manifest.step;
  const auto slash = m->path.rfind('/');
  if (const auto named =
          checkpoint::ParseStepDirectoryName(slash == std::string::npos ? m->path : m->path.substr(slash + 1));
      named && *named != manifest.step)
    return Status::Corruption(
        fmt::format("'{}' is named step {} but its manifest says step {}", m->path, *named, manifest.step));
  for (const auto& f : manifest.files) {
    auto info = m->fs->Stat(m->path + "/" + f.name);
    if (!info.ok()) {
      if (info.error().code() == StatusCode::kNotFound)
        return Status::Corruption(
            fmt::format("sharded checkpoint '{}' is missing '{}' named in its manifest", m->path, f.name));
      return info.error();
    }
    if (info->size != f.bytes)
      return Status::Corruption(fmt::format("'{}/{}' has {} bytes; the manifest says {} (truncated or replaced)",
                                            m->path, f.name, info->size, f.bytes));
    auto entry = std::make_unique<FileEntry>();
    entry->name = f.name;
    entry->bytes = f.bytes;
    entry->xxh3 = f.xxh3;
    if (auto blocks = m->layout.blocks.find(f.name); blocks != m->layout.blocks.end()) {
      if (blocks->second.size() != (f.bytes + m->layout.block_bytes - 1) / m->layout.block_bytes)
        return Status::Corruption(
            fmt::format("{}: '{}' has {} block checksums for {} bytes", where, f.name, blocks->second.size(), f.bytes));
      entry->blocks = blocks->second;
    }
    m->files.emplace(f.name, std::move(entry));
  }
  for (std::size_t i = 0; i < m->layout.tensors.size(); ++i) {
    const ShardedTensorInfo& t = m->layout.tensors[i];
    m->by_name.emplace(t.name, i);
    auto bytes = safetensors::TensorBytes(t.dtype, t.shape);
    if (!bytes.ok()) return bytes.error().WithContext(fmt::format("{}: tensor '{}'", where, t.name));
    for (const ShardPiece& p : t.pieces) {
      const auto f = m->files.find(p.file);
      if (f == m->files.end() || (f->second->blocks.empty() && f->second->bytes > 0))
        return Status::Corruption(
            fmt::format("{}: tensor '{}' has a piece in '{}', which is not a listed data file", where, t.name, p.file));
      const std::uint64_t piece_bytes = Volume(p.shape) * TensorDTypeSize(t.dtype);
      if (p.begin > f->second->bytes || piece_bytes > f->second->bytes - p.begin)
        return Status::Corruption(fmt::format("{}: tensor '{}''s piece from rank {} runs past the end of '{}'", where,
                                              t.name, p.rank, p.file));
    }
  }
  return std::make_unique<ShardedCheckpoint>(std::move(m));
}

std::int64_t ShardedCheckpoint::step() const {
  return impl_->step;
}
std::uint32_t ShardedCheckpoint::world_size() const {
  return impl_->layout.world_size;
}
const std::string& ShardedCheckpoint::path() const {
  return impl_->path;
}
const std::vector<ShardedTensorInfo>& ShardedCheckpoint::tensors() const {
  return impl_->layout.tensors;
}
const ShardedTensorInfo* ShardedCheckpoint::Find(std::string_view name) const {
  const auto found = impl_->by_name.find(name);
  return found == impl_->by_name.end() ? nullptr : &impl_->layout.tensors[found->second];
}
ShardedReadStats ShardedCheckpoint::stats() const {
  return {impl_->bytes_read.load(), impl_->blocks_checked.load()};
}

Result<CheckpointExtras> ShardedCheckpoint::RankExtras(std::uint32_t rank) const {
  if (rank >= impl_->layout.world_size)
    return Status::InvalidArgument(fmt::format("rank {} is not in the world of size {} that wrote '{}'", rank,
                                               impl_->layout.world_size, impl_->path));
  const std::string name = checkpoint::RankPartName(rank);
  const auto entry = impl_->files.find(name);
  if (entry == impl_->files.end())
    return Status::Corruption(fmt::format("'{}' does not list '{}' among its files", impl_->path, name));
  const std::string path = impl_->path + "/" + name;
  STOKER_ASSIGN_OR_RETURN(auto bytes, ReadWholeFile(*impl_->fs, path));
  // A part is small: checked whole against the manifest's checksum.
  checkpoint::ManifestFile expected;
  STOKER_ASSIGN_OR_RETURN(checkpoint::Manifest manifest, checkpoint::ReadManifest(*impl_->fs, impl_->path));
  for (const auto& f : manifest.files)
    if (f.name == name) expected = f;
  if (bytes.size() != expected.bytes || (impl_->verify && Xxh3(bytes) != expected.xxh3))
    return Status::Corruption(fmt::format("'{}' fails its size or xxh3 check against the manifest", path));
  STOKER_ASSIGN_OR_RETURN(
      checkpoint::RankPart part,
      checkpoint::DecodeRankPart(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path));
  if (part.rank != rank) return Status::Corruption(fmt::format("'{}' says it is rank {}'s", path, part.rank));
  return std::move(part.base.extras);
}

Status ShardedCheckpoint::VerifyFiles() {
  Impl& m = *impl_;
  std::vector<std::byte> buffer(static_cast<std::size_t>(m.layout.block_bytes));
  std::vector<FileEntry*> order;
  for (auto& [name, entry] : m.files) order.push_back(entry.get());
  std::sort(order.begin(), order.end(), [](const FileEntry* a, const FileEntry* b) { return a->name < b->name; });
  for (FileEntry* f : order) {
    STOKER_ASSIGN_OR_RETURN(ReadableFile * file, m.Open(*f));
    Xxh3Stream whole;
    std::uint64_t block = 0;
    for (std::uint64_t at = 0; at < f->bytes; at += m.layout.block_bytes, ++block) {
      const auto n = static_cast<std::size_t>(std::min(m.layout.block_bytes, f->bytes - at));
      const std::span<std::byte> data(buffer.data(), n);
      STOKER_RETURN_IF_ERROR(file->ReadExactAt(at, data));
      m.bytes_read.fetch_add(n, std::memory_order_relaxed);
      whole.Update(data);
      if (!f->blocks.empty() && Xxh3(data) != f->blocks[block])
        return Status::Corruption(
            fmt::format("'{}/{}' block {} (bytes {}..{}) fails its xxh3 checksum", m.path, f->name, block, at, at + n));
    }
    if (whole.Digest() != f->xxh3)
      return Status::Corruption(
          fmt::format("'{}/{}' fails its xxh3 checksum: the file changed after it was written", m.path, f->name));
  }
  return Status::Ok();
}

Status ShardedCheckpoint::ReadRegions(std::span<const RegionRequest> requests, std::uint32_t threads) {
  Impl& m = *impl_;
  std::vector<Region> regions;
  regions.reserve(requests.size());
  for (const RegionRequest& request : requests) {
    STOKER_ASSIGN_OR_RETURN(Region r, m.Validate(request));
    regions.push_back(std::move(r));
  }
  // One job per (region, piece it overlaps), in file order: consecutive
  // jobs then share the blocks at their boundaries and read each file
  // front to back, however the requests were ordered.
  struct Job {
    const Region* region;
    const ShardPiece* piece;
  };
  std::vector<Job> jobs;
  for (const Region& r : regions)
    for (const ShardPiece& p : r.tensor->pieces)
      if (r.Overlaps(p)) jobs.push_back({&r, &p});  // (a scalar overlaps its one piece)
  std::sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) {
    return a.piece->file != b.piece->file ? a.piece->file < b.piece->file : a.piece->begin < b.piece->begin;
  });
  // Threads take runs of consecutive jobs of at least 64 MiB of pieces.
  constexpr std::uint64_t kRunBytes = std::uint64_t{64} << 20;
  std::vector<std::size_t> run_starts;
  std::uint64_t in_run = kRunBytes;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    if (in_run >= kRunBytes || (i > 0 && jobs[i].piece->file != jobs[i - 1].piece->file)) {
      run_starts.push_back(i);
      in_run = 0;
    }
    in_run += Volume(jobs[i].piece->shape) * TensorDTypeSize(jobs[i].region->tensor->dtype);
  }
  run_starts.push_back(jobs.size());
  const std::size_t runs = run_starts.size() - 1;
  if (threads == 0) threads = std::min(4u, std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<std::uint32_t>(std::min<std::size_t>(threads, std::max<std::size_t>(1, runs)));
  std::atomic<std::size_t> next{0};
  std::mutex error_mu;
  Status first_error;
  auto work = [&] {
    BlockCache cache;
    for (;;) {
      const std::size_t run = next.fetch_add(1);
      if (run >= runs) return;
      for (std::size_t i = run_starts[run]; i < run_starts[run + 1]; ++i) {
        if (Status s = m.CopyPiece(*jobs[i].region, *jobs[i].piece, cache); !s.ok()) {
          std::lock_guard l(error_mu);
          if (first_error.ok()) first_error = std::move(s);
          next.store(runs);
          return;
        }
      }
    }
  };
  std::vector<std::thread> workers;
  for (std::uint32_t i = 1; i < threads; ++i) workers.emplace_back(work);
  work();
  for (auto& w : workers) w.join();
  return first_error;
}

Result<bool> IsShardedCheckpoint(const std::string& step_directory, FileSystem* file_system) {
  FileSystem& fs = file_system ? *file_system : *FileSystem::Default();
  STOKER_ASSIGN_OR_RETURN(checkpoint::Manifest manifest, checkpoint::ReadManifest(fs, step_directory));
  return !manifest.sharded_json.empty();
}

}  // namespace stoker
