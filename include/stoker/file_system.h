// stoker/file_system.h: the seam between stoker and storage.
//
// Everything stoker reads or writes goes through a FileSystem, so tests can
// inject faults (a vanished file, a full disk, a short read) and later layers
// can put remote storage behind the same interface. FileSystem::Default() is
// the local POSIX implementation.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/status.h"

namespace stoker {

// How a file's reads will go (ReadableFile::AdviseAccess).
enum class AccessPattern : std::uint8_t { kNormal, kRandom };
// A reader's setting for the kernel's read-ahead on its files
// (LoaderOptions::kernel_readahead, TokenLoaderOptions::kernel_readahead):
// kAuto advises kRandom when it reads at random over more than the page
// cache can hold.
enum class KernelReadahead : std::uint8_t { kAuto, kOn, kOff };

// A file opened for positional reads. Thread-safe: ReadAt may be called from
// several threads at once.
class ReadableFile {
 public:
  virtual ~ReadableFile() = default;
  // Reads up to out.size() bytes at `offset`; returns the count read, which is
  // smaller only at end of file.
  [[nodiscard]] virtual Result<std::size_t> ReadAt(std::uint64_t offset, std::span<std::byte> out) = 0;
  [[nodiscard]] virtual Result<std::uint64_t> Size() = 0;
  [[nodiscard]] virtual const std::string& path() const = 0;
  // A hint of how the file will be read from now on, for the kernel's
  // read-ahead: kRandom reads only what is asked (posix_fadvise
  // POSIX_FADV_RANDOM), kNormal restores the kernel's default. Files that
  // are not local ignore it (the default). An error changes nothing read.
  [[nodiscard]] virtual Status AdviseAccess(AccessPattern pattern) {
    (void)pattern;
    return Status::Ok();
  }
  // Reads exactly out.size() bytes at `offset` or fails with Corruption
  // ("file is shorter than expected") naming the path and offset.
  [[nodiscard]] Status ReadExactAt(std::uint64_t offset, std::span<std::byte> out);
};

// A file being written sequentially. Not thread-safe.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  [[nodiscard]] virtual Status Append(std::span<const std::byte> data) = 0;
  // Flushes to stable storage (fsync).
  [[nodiscard]] virtual Status Sync() = 0;
  // Starts writing what was appended so far to storage without waiting for
  // it, and waits for older write-back to finish, so that dirty memory stays
  // bounded and a final Sync() has little left to do. Durability still needs
  // Sync(). The default does nothing.
  [[nodiscard]] virtual Status StartWriteBack() { return Status::Ok(); }
  [[nodiscard]] virtual Status Close() = 0;
  [[nodiscard]] virtual const std::string& path() const = 0;
};

// How a file is mapped: shared and read-only, or private and writable, where
// writes change only this process's copy of the page (never the file).
enum class MapAccess : std::uint8_t { kReadOnly, kCopyOnWrite };

// A memory mapping of a whole file; unmapped on destruction.
class MappedFile {
 public:
  virtual ~MappedFile() = default;
  [[nodiscard]] virtual std::span<const std::byte> data() const = 0;
  // A hint of how the mapping will be touched, for the kernel's read-around
  // on page faults: kRandom faults in only the page touched (madvise
  // MADV_RANDOM), kNormal restores the default. The default does nothing.
  [[nodiscard]] virtual Status AdviseAccess(AccessPattern pattern) {
    (void)pattern;
    return Status::Ok();
  }
  // The same bytes, writable; empty unless mapped with kCopyOnWrite.
  [[nodiscard]] virtual std::span<std::byte> writable_data() = 0;
  [[nodiscard]] virtual const std::string& path() const = 0;
};

// An advisory lock held until destruction (see FileSystem::TryLock).
class FileLock {
 public:
  virtual ~FileLock() = default;
};

enum class FileType : std::uint8_t { kRegular, kDirectory, kSymlink, kOther };

struct DirEntry {
  std::string name;  // the entry's name inside the directory, not a path
  // What the entry is, links followed: a link to a folder is kDirectory; a
  // link that leads nowhere (dangling, or a loop) is kSymlink.
  FileType type = FileType::kOther;
  bool is_link = false;  // the entry itself is a symbolic link
};

struct FileInfo {
  FileType type = FileType::kOther;
  std::uint64_t size = 0;
};

// One read of a batch (FileSystem::ReadBatch).
struct ReadRequest {
  ReadableFile* file = nullptr;
  std::uint64_t offset = 0;
  std::span<std::byte> out;  // filled exactly, or `status` says why not
  Status status;             // set by ReadBatch; a file that ends early is Corruption
};

// One shard file a dataset will read, as its index describes it
// (FileSystem::AttachShards).
struct ShardFile {
  std::string path;  // where to open it (resolved against the index)
  std::string name;  // as the index names it, for messages and cache entry names
  std::uint64_t size = 0;
  std::uint64_t checksum = 0;  // xxh3-64 of the whole file
};

// How CreateForWrite treats an existing file. Neither ever writes through a
// symbolic link at `path`: that is an error.
enum class CreateMode : std::uint8_t {
  kTruncate,   // create, or empty an existing regular file
  kExclusive,  // create a new file; AlreadyExists if anything is at `path`
};

struct RemoteStats;
struct WarmReport;

// A file system that keeps local copies of remote shards (see remote.h).
class ShardCacheControl {
 public:
  virtual ~ShardCacheControl() = default;
  [[nodiscard]] virtual RemoteStats stats() const = 0;
  // Downloads as many shards as fit, in dataset order; progress(done, total)
  // may be empty.
  [[nodiscard]] virtual Result<WarmReport> Warm(const std::function<void(std::uint64_t, std::uint64_t)>& progress) = 0;
};

// Read-ahead hints from a reader that knows its future (the loader): the
// order in which it will read shard files (dataset shard numbers, repeats
// collapsed). Remote file systems fetch ahead in that order; see remote.h.
class ShardReadPlanner {
 public:
  virtual ~ShardReadPlanner() = default;
  // Appends visits to the plan; returns the position of the first.
  virtual std::uint64_t AppendPlan(std::span<const std::uint32_t> shards) = 0;
  // Reading has reached `position`.
  virtual void AdvancePlan(std::uint64_t position) = 0;
  // Forgets the plan (a new epoch started elsewhere, a restore).
  virtual void ResetPlan() = 0;
  // How many shard bytes the reader should keep in its working set at most.
  [[nodiscard]] virtual std::uint64_t working_set_bytes() const = 0;
  [[nodiscard]] virtual std::uint64_t largest_shard_bytes() const = 0;
};

// A file with no name, for scratch data too large to keep in memory (an
// index's restart tables while a pack runs): appended to, read back by
// offset, and gone when destroyed or when the process dies.
class ScratchFile {
 public:
  virtual ~ScratchFile() = default;
  [[nodiscard]] virtual Status Append(std::span<const std::byte> data) = 0;
  // Reads exactly out.size() bytes at `offset`, all of them appended before.
  [[nodiscard]] virtual Status ReadExactAt(std::uint64_t offset, std::span<std::byte> out) = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // The local POSIX file system. Lives for the whole program.
  static FileSystem* Default();

  [[nodiscard]] virtual Result<std::unique_ptr<ReadableFile>> OpenForRead(const std::string& path) = 0;
  [[nodiscard]] Result<std::unique_ptr<MappedFile>> Map(const std::string& path) {
    return Map(path, MapAccess::kReadOnly);
  }
  [[nodiscard]] virtual Result<std::unique_ptr<MappedFile>> Map(const std::string& path, MapAccess access) = 0;
  // Opens `path` for writing (CreateMode says how an existing file is
  // treated); never through a symbolic link.
  [[nodiscard]] virtual Result<std::unique_ptr<WritableFile>> CreateForWrite(const std::string& path,
                                                                             CreateMode mode) = 0;
  [[nodiscard]] Result<std::unique_ptr<WritableFile>> CreateForWrite(const std::string& path) {
    return CreateForWrite(path, CreateMode::kTruncate);
  }
  [[nodiscard]] virtual Status Rename(const std::string& from, const std::string& to) = 0;
  // Removes a file or a symbolic link (never what a link points to; not a
  // directory).
  [[nodiscard]] virtual Status Remove(const std::string& path) = 0;
  // Removes an empty directory.
  [[nodiscard]] virtual Status RemoveDirectory(const std::string& path) = 0;
  // Makes a directory and its missing parents; OK when it exists already.
  [[nodiscard]] virtual Status CreateDirectories(const std::string& path) = 0;
  // fsyncs a directory so that renames inside it are durable.
  [[nodiscard]] virtual Status SyncDirectory(const std::string& path) = 0;
  // Entries of a directory (without "." and ".."), in no particular order.
  [[nodiscard]] virtual Result<std::vector<DirEntry>> ListDirectory(const std::string& path) = 0;
  // Follows symlinks.
  [[nodiscard]] virtual Result<FileInfo> Stat(const std::string& path) = 0;
  // Does not follow a symlink at `path`: a link is reported as kSymlink.
  [[nodiscard]] virtual Result<FileInfo> LinkStat(const std::string& path) { return Stat(path); }
  // Bytes free for unprivileged writers on the file system holding `path`.
  [[nodiscard]] virtual Result<std::uint64_t> FreeBytes(const std::string& path);
  // Where the file `name` lies beside the file `path` (a shard beside its
  // index): `name` itself when absolute, else `name` in `path`'s folder.
  // URL file systems keep a query string on the result.
  [[nodiscard]] virtual std::string Sibling(const std::string& path, std::string_view name) const;
  // `path` as it may be printed (URL file systems hide credentials).
  [[nodiscard]] virtual std::string DisplayName(const std::string& path) const { return path; }
  // Performs every request, possibly concurrently and in any order; outcomes
  // go to each request's status. The default reads them one after another
  // with ReadExactAt; the POSIX file system submits them together through
  // io_uring where the kernel allows it.
  virtual void ReadBatch(std::span<ReadRequest> requests);
  // How ReadBatch reads on this thread: "io_uring", "pread", ...
  [[nodiscard]] virtual std::string ReadBatchMethod() { return "sequential ReadAt"; }
  // Takes an exclusive advisory lock on `path` (created if missing) without
  // waiting: Unavailable when another process holds it. The lock is released
  // when the returned object is destroyed or the process dies, so a crash
  // never leaves a stale lock.
  [[nodiscard]] virtual Result<std::unique_ptr<FileLock>> TryLock(const std::string& path) = 0;
  // A ScratchFile in folder `dir` (beside the data it is for, not in /tmp,
  // which may be memory). Unimplemented where this file system has none;
  // callers then keep the bytes in memory.
  [[nodiscard]] virtual Result<std::unique_ptr<ScratchFile>> CreateScratch(const std::string& dir) {
    return Status::Unimplemented("'" + dir + "': this file system keeps no scratch files");
  }
  // Where read-ahead hints go; nullptr when this file system has no use for them.
  [[nodiscard]] virtual ShardReadPlanner* read_planner() { return nullptr; }
  // A dataset opened on this file system names the shard files it will
  // read (remote file systems set up their shard cache here). The default
  // has nothing to do.
  [[nodiscard]] virtual Status AttachShards(std::span<const ShardFile> shards) {
    (void)shards;
    return Status::Ok();
  }
  // One large file read in parts (a Megatron .bin): remote file systems
  // serve `path`, of `size` bytes, through their shard cache in chunks of
  // `chunk_bytes` (chunk i: bytes [i * chunk_bytes, ...)), fetched by range
  // and kept as cache entries of the version `version` (a hash of what
  // describes the file, so that another version never matches). Open it
  // with OpenForRead; read_planner() takes chunk numbers. Use it in place
  // of AttachShards, not with it. Local file systems: Unimplemented (map
  // the file instead).
  [[nodiscard]] virtual Status AttachChunkedFile(const std::string& path, std::uint64_t size, std::uint64_t chunk_bytes,
                                                 std::uint64_t version) {
    const ChunkedFileSpec one{path, size, version};
    return AttachChunkedFiles(std::span(&one, 1), chunk_bytes);
  }
  // Several large files at once (a sharded checkpoint's), each as above;
  // chunks are numbered across them in order.
  struct ChunkedFileSpec {
    std::string path;
    std::uint64_t size = 0;
    std::uint64_t version = 0;
  };
  [[nodiscard]] virtual Status AttachChunkedFiles(std::span<const ChunkedFileSpec> files, std::uint64_t chunk_bytes) {
    (void)chunk_bytes;
    return Status::Unimplemented((files.empty() ? std::string("files") : files[0].path) +
                                 ": not a remote file system; map the file");
  }
  // The shard cache of a remote file system; nullptr for local ones.
  [[nodiscard]] virtual ShardCacheControl* shard_cache() { return nullptr; }
};

// Helpers over any FileSystem.
[[nodiscard]] Result<std::vector<std::byte>> ReadWholeFile(FileSystem& fs, const std::string& path);
// Writes `data` to `path` through AtomicFile: readers see the old file or
// the new one, never a mix, and the new one is durable on return.
[[nodiscard]] Status WriteWholeFileAtomically(FileSystem& fs, const std::string& path, std::span<const std::byte> data);
// Removes `path` and, when it is a directory, everything below it. OK when
// `path` does not exist. Never follows a symbolic link: a link (at `path`
// or anywhere below) is removed itself, what it points to is left alone.
[[nodiscard]] Status RemoveTree(FileSystem& fs, const std::string& path);

// A file that appears at its final path complete or not at all: written
// under a temporary name beside it (created exclusively, never through a
// link), then Commit() syncs it, renames it into place and syncs the
// folder. Destroyed uncommitted, it removes the temporary. A copy in a
// process forked from its creator neither commits (FailedPrecondition) nor
// removes the temporary, which is the creator's.
class AtomicFile {
 public:
  // `temp_path` empty: "<path>.tmp-<pid>-<n>". A stale temporary of that
  // name (a crashed writer's) is removed first.
  [[nodiscard]] static Result<AtomicFile> Create(FileSystem& fs, std::string path, std::string temp_path = "");
  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&& other) noexcept;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  [[nodiscard]] Status Append(std::span<const std::byte> data) { return file_->Append(data); }
  [[nodiscard]] WritableFile& file() { return *file_; }
  [[nodiscard]] const std::string& temp_path() const { return temp_path_; }
  // Starts over: the temporary is emptied (a download restarting).
  [[nodiscard]] Status Restart();
  // fsync, close, rename over the final path, fsync its folder (unless
  // `sync_folder` is false: the caller syncs it after several commits).
  [[nodiscard]] Status Commit(bool sync_folder = true);

 private:
  AtomicFile(FileSystem* fs, std::string path, std::string temp_path, std::unique_ptr<WritableFile> file);
  FileSystem* fs_ = nullptr;
  std::string path_, temp_path_;
  std::unique_ptr<WritableFile> file_;
  bool committed_ = false;
  pid_t creator_ = 0;  // the process that created the temporary
};

}  // namespace stoker
