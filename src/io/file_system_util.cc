// Helpers over any FileSystem: whole-file reads, atomic writes, tree
// removal that never follows links, and the defaults of the seam.
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>

#include <fmt/format.h>

#include "stoker/file_system.h"

namespace stoker {
namespace {

std::string ParentFolder(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

std::atomic<std::uint64_t> g_temp_counter{0};

}  // namespace

void FileSystem::ReadBatch(std::span<ReadRequest> requests) {
  for (auto& r : requests) r.status = r.file->ReadExactAt(r.offset, r.out);
}

Result<std::uint64_t> FileSystem::FreeBytes(const std::string& path) {
  struct statvfs v {};
  if (::statvfs(path.c_str(), &v) != 0) return Status::FromErrno(errno, fmt::format("statvfs '{}'", path));
  return static_cast<std::uint64_t>(v.f_bavail) * v.f_frsize;
}

std::string FileSystem::Sibling(const std::string& path, std::string_view name) const {
  if (name.starts_with('/')) return std::string(name);
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return std::string(name);
  // Plain concatenation: std::filesystem joins cost more than opening an index.
  return path.substr(0, slash + 1) + std::string(name);
}

Status ReadableFile::ReadExactAt(std::uint64_t offset, std::span<std::byte> out) {
  STOKER_ASSIGN_OR_RETURN(std::size_t n, ReadAt(offset, out));
  if (n != out.size()) {
    return Status::Corruption(fmt::format("'{}' is shorter than expected: wanted {} bytes at offset {}, got {}", path(),
                                          out.size(), offset, n));
  }
  return Status::Ok();
}

Result<std::vector<std::byte>> ReadWholeFile(FileSystem& fs, const std::string& path) {
  STOKER_ASSIGN_OR_RETURN(auto file, fs.OpenForRead(path));
  STOKER_ASSIGN_OR_RETURN(std::uint64_t size, file->Size());
  std::vector<std::byte> data(size);
  STOKER_ASSIGN_OR_RETURN(std::size_t n, file->ReadAt(0, data));
  if (n != size) return Status::Corruption(fmt::format("'{}' changed size while being read", path));
  return data;
}

// --- AtomicFile ---

AtomicFile::AtomicFile(FileSystem* fs, std::string path, std::string temp_path, std::unique_ptr<WritableFile> file)
    : fs_(fs), path_(std::move(path)), temp_path_(std::move(temp_path)), file_(std::move(file)), creator_(::getpid()) {}

AtomicFile::AtomicFile(AtomicFile&& other) noexcept
    : fs_(other.fs_),
      path_(std::move(other.path_)),
      temp_path_(std::move(other.temp_path_)),
      file_(std::move(other.file_)),
      committed_(std::exchange(other.committed_, true)),
      creator_(other.creator_) {}

AtomicFile& AtomicFile::operator=(AtomicFile&& other) noexcept {
  if (this != &other) {
    AtomicFile old(std::move(*this));  // abandons ours
    fs_ = other.fs_;
    path_ = std::move(other.path_);
    temp_path_ = std::move(other.temp_path_);
    file_ = std::move(other.file_);
    committed_ = std::exchange(other.committed_, true);
    creator_ = other.creator_;
  }
  return *this;
}

AtomicFile::~AtomicFile() {
  if (committed_ || fs_ == nullptr) return;
  if (::getpid() != creator_) {
    // A forked copy: the file and the bytes buffered for it are the
    // creator's. Destroying the writer would flush that buffer into the
    // creator's file a second time, so it is left (one descriptor and a
    // buffer, in a child).
    (void)file_.release();
    return;
  }
  if (file_) (void)file_->Close();
  (void)fs_->Remove(temp_path_);
}

Result<AtomicFile> AtomicFile::Create(FileSystem& fs, std::string path, std::string temp_path) {
  if (temp_path.empty()) temp_path = fmt::format("{}.tmp-{}-{}", path, ::getpid(), g_temp_counter.fetch_add(1));
  auto file = fs.CreateForWrite(temp_path, CreateMode::kExclusive);
  if (!file.ok() && file.error().code() == StatusCode::kAlreadyExists) {
    // A crashed writer's leftover (or a planted link): remove the entry
    // itself, never what a link points to, and try once more.
    const auto info = fs.LinkStat(temp_path);
    if (info.ok() && info->type == FileType::kDirectory)
      return Status::AlreadyExists(fmt::format("'{}' is a directory where a temporary file goes", temp_path));
    STOKER_RETURN_IF_ERROR(fs.Remove(temp_path));
    file = fs.CreateForWrite(temp_path, CreateMode::kExclusive);
  }
  if (!file.ok()) return file.error();
  return AtomicFile(&fs, std::move(path), std::move(temp_path), std::move(file).value());
}

Status AtomicFile::Restart() {
  if (committed_) return Status::Internal(fmt::format("'{}' was already committed", path_));
  (void)file_->Close();
  file_.reset();
  STOKER_RETURN_IF_ERROR(fs_->Remove(temp_path_));
  STOKER_ASSIGN_OR_RETURN(file_, fs_->CreateForWrite(temp_path_, CreateMode::kExclusive));
  return Status::Ok();
}

Status AtomicFile::Commit(bool sync_folder) {
  if (committed_) return Status::Internal(fmt::format("'{}' was already committed", path_));
  if (::getpid() != creator_)
    return Status::FailedPrecondition(
        fmt::format("'{}' is being written by process {}; this forked child (process {}) cannot publish it", path_,
                    creator_, ::getpid()));
  STOKER_RETURN_IF_ERROR(file_->Sync());
  STOKER_RETURN_IF_ERROR(file_->Close());
  STOKER_RETURN_IF_ERROR(fs_->Rename(temp_path_, path_));
  committed_ = true;
  if (sync_folder) return fs_->SyncDirectory(ParentFolder(path_));
  return Status::Ok();
}

Status WriteWholeFileAtomically(FileSystem& fs, const std::string& path, std::span<const std::byte> data) {
  STOKER_ASSIGN_OR_RETURN(AtomicFile file, AtomicFile::Create(fs, path));
  STOKER_RETURN_IF_ERROR(file.Append(data));
  return file.Commit();
}

Status RemoveTree(FileSystem& fs, const std::string& path) {
  auto info = fs.LinkStat(path);
  if (!info.ok()) {
    if (info.error().code() == StatusCode::kNotFound) return Status::Ok();
    return info.error();
  }
  // A link, even one to a folder, goes itself: what it points to is not ours.
  if (info->type != FileType::kDirectory) return fs.Remove(path);
  STOKER_ASSIGN_OR_RETURN(auto entries, fs.ListDirectory(path));
  for (const auto& entry : entries) {
    const std::string child = path + "/" + entry.name;
    if (entry.type == FileType::kDirectory && !entry.is_link) {
      STOKER_RETURN_IF_ERROR(RemoveTree(fs, child));
    } else {
      STOKER_RETURN_IF_ERROR(fs.Remove(child));
    }
  }
  return fs.RemoveDirectory(path);
}

}  // namespace stoker
