// A FileSystem that passes through to the real one but injects faults:
// a full disk after N bytes, files that vanish, reads that come up short,
// reads held until the test releases them.
#pragma once

#include <atomic>
#include <cerrno>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "stoker/file_system.h"

namespace stoker::testing {

class FaultFileSystem : public FileSystem {
 public:
  // Writes fail with ENOSPC once this many bytes have been written in total.
  std::atomic<std::uint64_t> disk_full_after{UINT64_MAX};
  // Writes to files whose path contains this fail with ENOSPC (empty: none).
  std::string disk_full_for_path_part;
  // Opening these paths fails with ENOENT, as if deleted after listing.
  std::set<std::string> vanished;
  // Reads of paths ending with this return half the bytes asked for.
  std::string short_reads_for_suffix;
  // What FreeBytes reports (unset: the real file system's answer).
  std::optional<std::uint64_t> free_bytes;
  // Files opened or mapped from now on record their AdviseAccess calls
  // (passed on to the real file): Advised() gives each path's last advice.
  std::atomic<bool> record_advice{false};
  std::map<std::string, AccessPattern> Advised() const {
    std::lock_guard lock(advice_mu_);
    return advised_;
  }
  // What read_planner() gives (a remote cache's, to see what a loader tells it).
  ShardReadPlanner* planner = nullptr;
  ShardReadPlanner* read_planner() override { return planner; }
  // While true, ReadBatch waits (a loader's reads stall until released).
  std::atomic<bool> reads_held{false};
  void ReleaseReads() {
    reads_held = false;
    reads_held.notify_all();
  }

  Result<std::unique_ptr<ReadableFile>> OpenForRead(const std::string& path) override {
    if (vanished.contains(path)) return Status::FromErrno(ENOENT, "open '" + path + "' for reading");
    STOKER_ASSIGN_OR_RETURN(auto file, base_->OpenForRead(path));
    if (!short_reads_for_suffix.empty() && path.ends_with(short_reads_for_suffix))
      return std::unique_ptr<ReadableFile>(std::make_unique<ShortReader>(std::move(file)));
    if (record_advice) return std::unique_ptr<ReadableFile>(std::make_unique<AdviceRecorder>(std::move(file), *this));
    return file;
  }
  using FileSystem::Map;
  Result<std::unique_ptr<MappedFile>> Map(const std::string& path, MapAccess access) override {
    if (vanished.contains(path)) return Status::FromErrno(ENOENT, "open '" + path + "' for reading");
    STOKER_ASSIGN_OR_RETURN(auto mapped, base_->Map(path, access));
    if (record_advice)
      return std::unique_ptr<MappedFile>(std::make_unique<MappedAdviceRecorder>(std::move(mapped), *this));
    return mapped;
  }
  using FileSystem::CreateForWrite;
  Result<std::unique_ptr<WritableFile>> CreateForWrite(const std::string& path, CreateMode mode) override {
    STOKER_ASSIGN_OR_RETURN(auto file, base_->CreateForWrite(path, mode));
    return std::unique_ptr<WritableFile>(std::make_unique<FaultyWriter>(std::move(file), *this));
  }
  // Scratch files (a pack's restart tables) count toward disk_full_after,
  // and fail for disk_full_for_path_part "scratch". With no_scratch, there
  // are none (callers keep the bytes in memory).
  bool no_scratch = false;
  Result<std::unique_ptr<ScratchFile>> CreateScratch(const std::string& dir) override {
    if (no_scratch) return FileSystem::CreateScratch(dir);
    STOKER_ASSIGN_OR_RETURN(auto file, base_->CreateScratch(dir));
    ++scratch_files_;
    return std::unique_ptr<ScratchFile>(std::make_unique<FaultyScratch>(std::move(file), *this));
  }
  [[nodiscard]] int scratch_files() const { return scratch_files_; }
  Status Rename(const std::string& from, const std::string& to) override { return base_->Rename(from, to); }
  Status Remove(const std::string& path) override { return base_->Remove(path); }
  Status RemoveDirectory(const std::string& path) override { return base_->RemoveDirectory(path); }
  Result<std::unique_ptr<FileLock>> TryLock(const std::string& path) override { return base_->TryLock(path); }
  Status CreateDirectories(const std::string& path) override { return base_->CreateDirectories(path); }
  Status SyncDirectory(const std::string& path) override { return base_->SyncDirectory(path); }
  Result<std::vector<DirEntry>> ListDirectory(const std::string& path) override { return base_->ListDirectory(path); }
  Result<FileInfo> Stat(const std::string& path) override { return base_->Stat(path); }
  Result<FileInfo> LinkStat(const std::string& path) override { return base_->LinkStat(path); }
  Result<std::uint64_t> FreeBytes(const std::string& path) override {
    if (free_bytes) return *free_bytes;
    return base_->FreeBytes(path);
  }
  // The default, one ReadExactAt per request through the faulty files, once released.
  void ReadBatch(std::span<ReadRequest> requests) override {
    reads_held.wait(true);
    FileSystem::ReadBatch(requests);
  }

 private:
  class FaultyWriter : public WritableFile {
   public:
    FaultyWriter(std::unique_ptr<WritableFile> inner, FaultFileSystem& fs) : inner_(std::move(inner)), fs_(fs) {}
    Status Append(std::span<const std::byte> data) override {
      bool suffix_full =
          !fs_.disk_full_for_path_part.empty() && path().find(fs_.disk_full_for_path_part) != std::string::npos;
      if (suffix_full || fs_.written_.fetch_add(data.size()) + data.size() > fs_.disk_full_after)
        return Status::FromErrno(ENOSPC, "write '" + path() + "'");
      return inner_->Append(data);
    }
    Status Sync() override { return inner_->Sync(); }
    Status StartWriteBack() override { return inner_->StartWriteBack(); }
    Status Close() override { return inner_->Close(); }
    const std::string& path() const override { return inner_->path(); }

   private:
    std::unique_ptr<WritableFile> inner_;
    FaultFileSystem& fs_;
  };

  class FaultyScratch : public ScratchFile {
   public:
    FaultyScratch(std::unique_ptr<ScratchFile> inner, FaultFileSystem& fs) : inner_(std::move(inner)), fs_(fs) {}
    Status Append(std::span<const std::byte> data) override {
      if (fs_.disk_full_for_path_part == "scratch" ||
          fs_.written_.fetch_add(data.size()) + data.size() > fs_.disk_full_after)
        return Status::FromErrno(ENOSPC, "write a scratch file");
      return inner_->Append(data);
    }
    Status ReadExactAt(std::uint64_t offset, std::span<std::byte> out) override {
      return inner_->ReadExactAt(offset, out);
    }

   private:
    std::unique_ptr<ScratchFile> inner_;
    FaultFileSystem& fs_;
  };

  class ShortReader : public ReadableFile {
   public:
    explicit ShortReader(std::unique_ptr<ReadableFile> inner) : inner_(std::move(inner)) {}
    Result<std::size_t> ReadAt(std::uint64_t offset, std::span<std::byte> out) override {
      return inner_->ReadAt(offset, out.first(out.size() / 2));
    }
    Result<std::uint64_t> Size() override { return inner_->Size(); }
    const std::string& path() const override { return inner_->path(); }

   private:
    std::unique_ptr<ReadableFile> inner_;
  };

  class AdviceRecorder : public ReadableFile {
   public:
    AdviceRecorder(std::unique_ptr<ReadableFile> inner, FaultFileSystem& fs) : inner_(std::move(inner)), fs_(fs) {}
    Result<std::size_t> ReadAt(std::uint64_t offset, std::span<std::byte> out) override {
      return inner_->ReadAt(offset, out);
    }
    Result<std::uint64_t> Size() override { return inner_->Size(); }
    const std::string& path() const override { return inner_->path(); }
    Status AdviseAccess(AccessPattern pattern) override {
      fs_.RecordAdvice(path(), pattern);
      return inner_->AdviseAccess(pattern);
    }

   private:
    std::unique_ptr<ReadableFile> inner_;
    FaultFileSystem& fs_;
  };

  class MappedAdviceRecorder : public MappedFile {
   public:
    MappedAdviceRecorder(std::unique_ptr<MappedFile> inner, FaultFileSystem& fs) : inner_(std::move(inner)), fs_(fs) {}
    std::span<const std::byte> data() const override { return inner_->data(); }
    std::span<std::byte> writable_data() override { return inner_->writable_data(); }
    const std::string& path() const override { return inner_->path(); }
    Status AdviseAccess(AccessPattern pattern) override {
      fs_.RecordAdvice(path(), pattern);
      return inner_->AdviseAccess(pattern);
    }

   private:
    std::unique_ptr<MappedFile> inner_;
    FaultFileSystem& fs_;
  };

  void RecordAdvice(const std::string& path, AccessPattern pattern) {
    std::lock_guard lock(advice_mu_);
    advised_[path] = pattern;
  }

  FileSystem* base_ = FileSystem::Default();
  mutable std::mutex advice_mu_;
  std::map<std::string, AccessPattern> advised_;
  std::atomic<std::uint64_t> written_{0};
  std::atomic<int> scratch_files_{0};
};

}  // namespace stoker::testing
