#include "dataset/index_file.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

namespace stoker {
namespace {

class AtomicFileSink final : public index_format::ByteSink {
 public:
  explicit AtomicFileSink(AtomicFile& file) : file_(&file) {}
  [[nodiscard]] Status Write(std::span<const std::byte> bytes) override { return file_->Append(bytes); }

 private:
  AtomicFile* file_;
};

// A ByteStore in a ScratchFile, with the bytes not yet written held in a block.
class ScratchByteStore final : public index_format::ByteStore {
 public:
  ScratchByteStore(std::unique_ptr<ScratchFile> file, std::size_t block_bytes)
      : file_(std::move(file)), block_bytes_(block_bytes) {
    block_.reserve(block_bytes_);
  }

  [[nodiscard]] Status Append(std::span<const std::byte> bytes) override {
    size_ += bytes.size();
    if (block_.size() + bytes.size() > block_bytes_) STOKER_RETURN_IF_ERROR(Flush());
    if (bytes.size() >= block_bytes_) {
      written_ += bytes.size();
      return file_->Append(bytes);
    }
    block_.insert(block_.end(), bytes.begin(), bytes.end());
    return Status::Ok();
  }
  [[nodiscard]] std::uint64_t size() const override { return size_; }
  [[nodiscard]] Status ReadAt(std::uint64_t offset, std::span<std::byte> out) const override {
    if (offset > size_ || out.size() > size_ - offset)
      return Status::Internal(
          fmt::format("a read of {} bytes at {} past a scratch store of {} bytes", out.size(), offset, size_));
    // The part in the file, then the part still in the block.
    std::size_t done = 0;
    if (offset < written_) {
      done = static_cast<std::size_t>(std::min<std::uint64_t>(written_ - offset, out.size()));
      STOKER_RETURN_IF_ERROR(file_->ReadExactAt(offset, out.first(done)));
    }
    if (done < out.size()) {
      const auto at = static_cast<std::size_t>(offset + done - written_);
      std::memcpy(out.data() + done, block_.data() + at, out.size() - done);
    }
    return Status::Ok();
  }
  [[nodiscard]] Status WriteTo(index_format::ByteSink& out) const override {
    std::vector<std::byte> chunk(static_cast<std::size_t>(std::min<std::uint64_t>(written_, block_bytes_)));
    for (std::uint64_t at = 0; at < written_;) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(written_ - at, chunk.size()));
      STOKER_RETURN_IF_ERROR(file_->ReadExactAt(at, std::span(chunk).first(n)));
      STOKER_RETURN_IF_ERROR(out.Write(std::span(chunk).first(n)));
      at += n;
    }
    return out.Write(block_);
  }

 private:
  [[nodiscard]] Status Flush() {
    STOKER_RETURN_IF_ERROR(file_->Append(block_));
    written_ += block_.size();
    block_.clear();
    return Status::Ok();
  }
  std::unique_ptr<ScratchFile> file_;
  std::size_t block_bytes_;
  std::vector<std::byte> block_;  // appended after the file's written_ bytes
  std::uint64_t written_ = 0, size_ = 0;
};

}  // namespace

namespace {

std::unique_ptr<index_format::ByteStore> StoreIn(FileSystem& fs, const std::string& dir, std::size_t block_bytes) {
  auto scratch = fs.CreateScratch(dir);
  if (!scratch.ok()) return std::make_unique<index_format::MemoryByteStore>();
  return std::make_unique<ScratchByteStore>(std::move(*scratch), std::max<std::size_t>(block_bytes, 1));
}

}  // namespace

index_format::IndexBuilder::Stores BuilderStoresFor(FileSystem& fs, const std::string& dir, std::size_t block_bytes) {
  index_format::IndexBuilder::Stores stores;
  stores.records = StoreIn(fs, dir, block_bytes);
  stores.keys = StoreIn(fs, dir, block_bytes);
  stores.restart_tables = StoreIn(fs, dir, block_bytes);
  return stores;
}

Status WriteIndexFile(FileSystem& fs, const std::string& path,
                      const std::function<Status(index_format::ByteSink&)>& write) {
  STOKER_ASSIGN_OR_RETURN(AtomicFile file, AtomicFile::Create(fs, path));
  AtomicFileSink sink(file);
  STOKER_RETURN_IF_ERROR(write(sink));
  return file.Commit();
}

}  // namespace stoker
