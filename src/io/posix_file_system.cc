// The local POSIX FileSystem: pread, buffered sequential writes, mmap.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "core/unique_fd.h"
#include "io/uring_reader.h"
#include "stoker/file_system.h"

namespace stoker {
namespace {

// An O_TMPFILE (or a named temporary unlinked at once where the file system
// has no O_TMPFILE): no name, so nothing is left behind by a crash.
class PosixScratchFile final : public ScratchFile {
 public:
  PosixScratchFile(std::string dir, UniqueFd fd) : dir_(std::move(dir)), fd_(std::move(fd)) {}

  Status Append(std::span<const std::byte> data) override {
    std::size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = ::pwrite(fd_.get(), data.data() + done, data.size() - done, static_cast<off_t>(size_ + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, fmt::format("write a scratch file in '{}'", dir_));
      }
      done += static_cast<std::size_t>(n);
    }
    size_ += done;
    return Status::Ok();
  }

  Status ReadExactAt(std::uint64_t offset, std::span<std::byte> out) override {
    if (offset > size_ || size_ - offset < out.size())
      return Status::Internal(
          fmt::format("a scratch file in '{}': {} bytes at {} asked of {}", dir_, out.size(), offset, size_));
    std::size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = ::pread(fd_.get(), out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        return n < 0 ? Status::FromErrno(errno, fmt::format("read a scratch file in '{}'", dir_))
                     : Status::IOError(fmt::format("a scratch file in '{}' is shorter than written", dir_));
      done += static_cast<std::size_t>(n);
    }
    return Status::Ok();
  }

 private:
  std::string dir_;
  UniqueFd fd_;
  std::uint64_t size_ = 0;
};

class PosixReadableFile final : public ReadableFile {
 public:
  PosixReadableFile(std::string path, UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}

  Result<std::size_t> ReadAt(std::uint64_t offset, std::span<std::byte> out) override {
    std::size_t done = 0;
    while (done < out.size()) {
      ssize_t n = ::pread(fd_.get(), out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, fmt::format("read '{}' at offset {}", path_, offset + done));
      }
      if (n == 0) break;
      done += static_cast<std::size_t>(n);
    }
    return done;
  }

  Result<std::uint64_t> Size() override {
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) return Status::FromErrno(errno, fmt::format("stat '{}'", path_));
    return static_cast<std::uint64_t>(st.st_size);
  }

  const std::string& path() const override { return path_; }
  [[nodiscard]] int fd() const { return fd_.get(); }

  Status AdviseAccess(AccessPattern pattern) override {
    const int advice = pattern == AccessPattern::kRandom ? POSIX_FADV_RANDOM : POSIX_FADV_NORMAL;
    if (const int err = ::posix_fadvise(fd_.get(), 0, 0, advice); err != 0)
      return Status::FromErrno(err, fmt::format("advise the kernel of reads of '{}'", path_));
    return Status::Ok();
  }

 private:
  std::string path_;
  UniqueFd fd_;
};

// One io_uring per thread that reads batches, made on first use. Null when
// io_uring is unavailable (after one failure the process stops trying) or
// disabled by STOKER_DISABLE_IO_URING when the thread first reads.
std::atomic<bool> g_uring_unavailable{false};
UringReader* ThreadUring() {
  thread_local std::unique_ptr<UringReader> ring;
  thread_local bool tried = false;
  if (!tried && !g_uring_unavailable.load(std::memory_order_relaxed)) {
    tried = true;
    const char* off = std::getenv("STOKER_DISABLE_IO_URING");
    if (off == nullptr || *off == '\0' || *off == '0') {
      auto created = UringReader::Create();
      if (created.ok()) {
        ring = std::move(*created);
      } else {
        g_uring_unavailable.store(true, std::memory_order_relaxed);
      }
    }
  }
  return ring.get();
}

// Buffers appends so that many small tar headers cost few system calls.
class PosixWritableFile final : public WritableFile {
 public:
  static constexpr std::size_t kBufferSize = 1 << 20;

  PosixWritableFile(std::string path, UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {
    buffer_.reserve(kBufferSize);
  }
  ~PosixWritableFile() override {
    if (fd_.valid()) (void)Close();
  }

  Status Append(std::span<const std::byte> data) override {
    if (!fd_.valid()) return Status::Internal(fmt::format("append to closed file '{}'", path_));
    if (buffer_.size() + data.size() > kBufferSize) {
      STOKER_RETURN_IF_ERROR(Flush());
      if (data.size() >= kBufferSize) return WriteAll(data);
    }
    buffer_.insert(buffer_.end(), data.begin(), data.end());
    return Status::Ok();
  }

  Status StartWriteBack() override {
    STOKER_RETURN_IF_ERROR(Flush());
    if (written_ == write_back_started_) return Status::Ok();
    // Wait for the range started last time (bounding dirty pages to about two
    // ranges), then start this one: the disk works while we produce more.
    if (write_back_waited_ < write_back_started_) {
      if (::sync_file_range(fd_.get(), static_cast<off_t>(write_back_waited_),
                            static_cast<off_t>(write_back_started_ - write_back_waited_),
                            SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER) != 0)
        return Status::FromErrno(errno, fmt::format("write back '{}'", path_));
      write_back_waited_ = write_back_started_;
    }
    if (::sync_file_range(fd_.get(), static_cast<off_t>(write_back_started_),
                          static_cast<off_t>(written_ - write_back_started_), SYNC_FILE_RANGE_WRITE) != 0)
      return Status::FromErrno(errno, fmt::format("write back '{}'", path_));
    write_back_started_ = written_;
    return Status::Ok();
  }

  Status Sync() override {
    STOKER_RETURN_IF_ERROR(Flush());
    if (::fsync(fd_.get()) != 0) return Status::FromErrno(errno, fmt::format("fsync '{}'", path_));
    return Status::Ok();
  }

  Status Close() override {
    if (!fd_.valid()) return Status::Ok();
    Status flushed = Flush();
    int fd = fd_.release();
    if (::close(fd) != 0 && flushed.ok()) return Status::FromErrno(errno, fmt::format("close '{}'", path_));
    return flushed;
  }

  const std::string& path() const override { return path_; }

 private:
  Status Flush() {
    Status s = WriteAll(buffer_);
    buffer_.clear();
    return s;
  }
  Status WriteAll(std::span<const std::byte> data) {
    std::size_t done = 0;
    while (done < data.size()) {
      ssize_t n = ::write(fd_.get(), data.data() + done, data.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, fmt::format("write '{}'", path_));
      }
      done += static_cast<std::size_t>(n);
    }
    written_ += data.size();
    return Status::Ok();
  }

  std::string path_;
  UniqueFd fd_;
  std::vector<std::byte> buffer_;
  std::uint64_t written_ = 0;             // bytes handed to the kernel
  std::uint64_t write_back_started_ = 0;  // StartWriteBack() has started [0, this)
  std::uint64_t write_back_waited_ = 0;   // ... and waited for [0, this)
};

class PosixMappedFile final : public MappedFile {
 public:
  PosixMappedFile(std::string path, void* base, std::size_t size, bool writable)
      : path_(std::move(path)), base_(base), size_(size), writable_(writable) {}
  ~PosixMappedFile() override {
    if (base_ != nullptr) ::munmap(base_, size_);
  }
  PosixMappedFile(const PosixMappedFile&) = delete;
  PosixMappedFile& operator=(const PosixMappedFile&) = delete;

  std::span<const std::byte> data() const override { return {static_cast<const std::byte*>(base_), size_}; }
  std::span<std::byte> writable_data() override {
    if (!writable_) return {};
    return {static_cast<std::byte*>(base_), size_};
  }
  const std::string& path() const override { return path_; }
  Status AdviseAccess(AccessPattern pattern) override {
    if (base_ == nullptr || size_ == 0) return Status::Ok();
    if (::madvise(base_, size_, pattern == AccessPattern::kRandom ? MADV_RANDOM : MADV_NORMAL) != 0)
      return Status::FromErrno(errno, fmt::format("advise the kernel of reads of '{}'", path_));
    return Status::Ok();
  }

 private:
  std::string path_;
  void* base_;
  std::size_t size_;
  bool writable_;
};

class PosixFileLock final : public FileLock {
 public:
  explicit PosixFileLock(UniqueFd fd) : fd_(std::move(fd)) {}

 private:
  UniqueFd fd_;  // closing the descriptor releases the flock
};

FileType TypeFromMode(mode_t mode) {
  if (S_ISREG(mode)) return FileType::kRegular;
  if (S_ISDIR(mode)) return FileType::kDirectory;
  if (S_ISLNK(mode)) return FileType::kSymlink;
  return FileType::kOther;
}

class PosixFileSystem final : public FileSystem {
 public:
  Result<std::unique_ptr<ReadableFile>> OpenForRead(const std::string& path) override {
    STOKER_ASSIGN_OR_RETURN(UniqueFd fd, OpenRegular(path));
    return std::unique_ptr<ReadableFile>(std::make_unique<PosixReadableFile>(path, std::move(fd)));
  }

  Result<std::unique_ptr<MappedFile>> Map(const std::string& path, MapAccess access) override {
    STOKER_ASSIGN_OR_RETURN(UniqueFd fd, OpenRegular(path));
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, fmt::format("stat '{}'", path));
    auto size = static_cast<std::size_t>(st.st_size);
    const bool writable = access == MapAccess::kCopyOnWrite;
    if (size == 0) return std::unique_ptr<MappedFile>(std::make_unique<PosixMappedFile>(path, nullptr, 0, writable));
    void* base = writable ? ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd.get(), 0)
                          : ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
    if (base == MAP_FAILED) return Status::FromErrno(errno, fmt::format("mmap '{}'", path));
    return std::unique_ptr<MappedFile>(std::make_unique<PosixMappedFile>(path, base, size, writable));
  }

  Result<std::unique_ptr<WritableFile>> CreateForWrite(const std::string& path, CreateMode mode) override {
    // O_NOFOLLOW: a link planted at a predictable name must not redirect
    // the write; O_EXCL (which never follows a link either) for temporaries.
    const int how = mode == CreateMode::kExclusive ? O_EXCL : O_TRUNC;
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | how, 0644);
    if (fd < 0) {
      if (errno == ELOOP)
        return Status::InvalidArgument(
            fmt::format("'{}' is a symbolic link; refusing to write through it (remove it first)", path));
      return Status::FromErrno(errno, fmt::format("create '{}'", path));
    }
    return std::unique_ptr<WritableFile>(std::make_unique<PosixWritableFile>(path, UniqueFd(fd)));
  }

  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0)
      return Status::FromErrno(errno, fmt::format("rename '{}' to '{}'", from, to));
    return Status::Ok();
  }

  Status Remove(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return Status::FromErrno(errno, fmt::format("remove '{}'", path));
    return Status::Ok();
  }

  Status RemoveDirectory(const std::string& path) override {
    if (::rmdir(path.c_str()) != 0) return Status::FromErrno(errno, fmt::format("remove directory '{}'", path));
    return Status::Ok();
  }

  Result<std::unique_ptr<ScratchFile>> CreateScratch(const std::string& dir) override {
    UniqueFd fd(::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
    if (!fd.valid() && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
      std::string name = dir + "/.stoker-scratch-XXXXXX";
      fd = UniqueFd(::mkostemp(name.data(), O_CLOEXEC));
      if (fd.valid() && ::unlink(name.c_str()) != 0)
        return Status::FromErrno(errno, fmt::format("remove the name of scratch file '{}'", name));
    }
    if (!fd.valid()) return Status::FromErrno(errno, fmt::format("create a scratch file in '{}'", dir));
    return std::unique_ptr<ScratchFile>(std::make_unique<PosixScratchFile>(dir, std::move(fd)));
  }

  Result<std::unique_ptr<FileLock>> TryLock(const std::string& path) override {
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!fd.valid()) return Status::FromErrno(errno, fmt::format("open lock file '{}'", path));
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) return Status::Unavailable(fmt::format("'{}' is locked by another process", path));
      return Status::FromErrno(errno, fmt::format("lock '{}'", path));
    }
    return std::unique_ptr<FileLock>(std::make_unique<PosixFileLock>(std::move(fd)));
  }

  Status CreateDirectories(const std::string& path) override {
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec) return Status::FromErrno(ec.value(), fmt::format("create directory '{}'", path));
    return Status::Ok();
  }

  Status SyncDirectory(const std::string& path) override {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd.valid()) return Status::FromErrno(errno, fmt::format("open directory '{}'", path));
    if (::fsync(fd.get()) != 0) return Status::FromErrno(errno, fmt::format("fsync directory '{}'", path));
    return Status::Ok();
  }

  Result<std::vector<DirEntry>> ListDirectory(const std::string& path) override {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) return Status::FromErrno(errno, fmt::format("list directory '{}'", path));
    std::vector<DirEntry> entries;
    errno = 0;
    while (const dirent* e = ::readdir(dir)) {
      std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      struct stat st {};
      std::string full = path + "/" + name;
      FileType type = FileType::kOther;
      bool is_link = false;
      if (::lstat(full.c_str(), &st) == 0) {
        is_link = S_ISLNK(st.st_mode);
        type = TypeFromMode(st.st_mode);
        // A link is what it leads to; one that leads nowhere stays kSymlink.
        if (is_link && ::stat(full.c_str(), &st) == 0) type = TypeFromMode(st.st_mode);
      }
      entries.push_back({std::move(name), type, is_link});
      errno = 0;
    }
    int saved = errno;
    ::closedir(dir);
    if (saved != 0) return Status::FromErrno(saved, fmt::format("list directory '{}'", path));
    return entries;
  }

  void ReadBatch(std::span<ReadRequest> requests) override {
    UringReader* ring = ThreadUring();
    std::vector<UringReader::Read> reads;
    if (ring != nullptr) {
      reads.reserve(requests.size());
      for (const auto& r : requests) {
        auto* posix = dynamic_cast<PosixReadableFile*>(r.file);
        if (posix == nullptr) {  // someone else's file: read the plain way
          reads.clear();
          break;
        }
        reads.push_back({posix->fd(), r.offset, r.out});
      }
    }
    if (reads.empty() || !ring->ReadAll(reads).ok()) {
      FileSystem::ReadBatch(requests);
      return;
    }
    for (std::size_t i = 0; i < requests.size(); ++i) {
      ReadRequest& r = requests[i];
      const UringReader::Read& done = reads[i];
      if (done.error != 0) {
        r.status = Status::FromErrno(done.error, fmt::format("read '{}' at offset {}", r.file->path(), r.offset));
      } else if (done.done != r.out.size()) {
        r.status = Status::Corruption(fmt::format("'{}' is shorter than expected: wanted {} bytes at offset {}, got {}",
                                                  r.file->path(), r.out.size(), r.offset, done.done));
      } else {
        r.status = Status::Ok();
      }
    }
  }

  std::string ReadBatchMethod() override { return ThreadUring() != nullptr ? "io_uring" : "pread"; }

  Result<FileInfo> Stat(const std::string& path) override {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return StatError(path);
    return FileInfo{TypeFromMode(st.st_mode), static_cast<std::uint64_t>(st.st_size)};
  }

  Result<FileInfo> LinkStat(const std::string& path) override {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return Status::FromErrno(errno, fmt::format("stat '{}'", path));
    return FileInfo{TypeFromMode(st.st_mode), static_cast<std::uint64_t>(st.st_size)};
  }

  Result<std::uint64_t> FreeBytes(const std::string& path) override {
    struct statvfs v {};
    if (::statvfs(path.c_str(), &v) != 0) return Status::FromErrno(errno, fmt::format("statvfs '{}'", path));
    return static_cast<std::uint64_t>(v.f_bavail) * v.f_frsize;
  }

 private:
  // Says why `path` cannot be stat'ed, telling a dangling link and a loop
  // of links apart from a missing file.
  static Status StatError(const std::string& path) {
    const int error = errno;
    struct stat st {};
    if (error == ELOOP) return Status::InvalidArgument(fmt::format("'{}' is a loop of symbolic links", path));
    if (error == ENOENT && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      std::string target(4096, '\0');
      const ssize_t n = ::readlink(path.c_str(), target.data(), target.size());
      target.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
      return Status::NotFound(
          fmt::format("'{}' is a dangling symbolic link (to '{}', which does not exist)", path, target));
    }
    return Status::FromErrno(error, fmt::format("stat '{}'", path));
  }

  // Opens a regular file for reading. Without O_NONBLOCK, opening a FIFO
  // would wait for a writer forever; the type is checked before any read.
  static Result<UniqueFd> OpenRegular(const std::string& path) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
    if (!fd.valid()) {
      if (errno == ENOENT || errno == ELOOP) return StatError(path).WithContext("open for reading");
      return Status::FromErrno(errno, fmt::format("open '{}' for reading", path));
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, fmt::format("stat '{}'", path));
    if (!S_ISREG(st.st_mode)) {
      const char* what = S_ISDIR(st.st_mode)                          ? "a directory"
                         : S_ISFIFO(st.st_mode)                       ? "a FIFO (named pipe)"
                         : S_ISSOCK(st.st_mode)                       ? "a socket"
                         : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                                      : "not a regular file";
      return Status::InvalidArgument(fmt::format("'{}' is {}, not a regular file", path, what));
    }
    const int flags = ::fcntl(fd.get(), F_GETFL);
    if (flags >= 0) (void)::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
    return fd;
  }
};

}  // namespace

FileSystem* FileSystem::Default() {
  static PosixFileSystem* fs = new PosixFileSystem();  // never destroyed: used until exit
  return fs;
}

}  // namespace stoker
