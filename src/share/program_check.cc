// Whether a program will load a preloaded library (CheckPreloadable in
// stoker/gpu_share.h): the dynamic loader ignores LD_PRELOAD for
// statically linked programs and runs set-ID or capability-bearing ones in
// secure mode, where a preload path is ignored too. Such a program would
// run unlimited, so it is refused.
#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "stoker/gpu_share.h"

namespace stoker {
namespace {

// `name` on PATH (or as given when it has a slash).
Result<std::string> Resolve(const std::string& name) {
  namespace fs = std::filesystem;
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string dirs = path && *path ? path : "/usr/local/bin:/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    const std::size_t colon = dirs.find(':', start);
    const std::string dir = dirs.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    start = colon == std::string::npos ? dirs.size() + 1 : colon + 1;
    const fs::path candidate = fs::path(dir.empty() ? "." : dir) / name;
    if (::access(candidate.c_str(), X_OK) == 0 && fs::is_regular_file(candidate)) return candidate.string();
  }
  return Status::NotFound(fmt::format("'{}' was not found on PATH", name));
}

Result<std::string> Check(const std::string& command, int depth) {
  STOKER_ASSIGN_OR_RETURN(std::string path, Resolve(command));
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::FromErrno(errno, path);
  if (!S_ISREG(st.st_mode)) return Status::FailedPrecondition(fmt::format("'{}' is not a program file", path));
  if (st.st_mode & (S_ISUID | S_ISGID))
    return Status::FailedPrecondition(fmt::format(
        "'{}' is set-user-ID or set-group-ID: the loader ignores LD_PRELOAD for it, so it could not be held to a "
        "GPU quota",
        path));
  if (::getxattr(path.c_str(), "security.capability", nullptr, 0) >= 0)
    return Status::FailedPrecondition(fmt::format(
        "'{}' has file capabilities: the loader ignores LD_PRELOAD for it, so it could not be held to a GPU quota",
        path));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, path);
  unsigned char head[256] = {};
  const ssize_t n = ::pread(fd, head, sizeof(head), 0);
  if (n >= 2 && head[0] == '#' && head[1] == '!') {
    ::close(fd);
    if (depth > 2) return Status::FailedPrecondition(fmt::format("'{}': scripts nest too deeply", path));
    // The interpreter is what runs: "#!/usr/bin/env python3" -> python3.
    std::string line(reinterpret_cast<char*>(head) + 2, static_cast<std::size_t>(n) - 2);
    line = line.substr(0, line.find('\n'));
    std::size_t a = line.find_first_not_of(" \t");
    if (a == std::string::npos) return Status::FailedPrecondition(fmt::format("'{}' names no interpreter", path));
    std::size_t b = line.find_first_of(" \t", a);
    std::string interpreter = line.substr(a, b == std::string::npos ? std::string::npos : b - a);
    if (std::filesystem::path(interpreter).filename() == "env" && b != std::string::npos) {
      a = line.find_first_not_of(" \t", b);
      if (a != std::string::npos) {
        b = line.find_first_of(" \t", a);
        interpreter = line.substr(a, b == std::string::npos ? std::string::npos : b - a);
      }
    }
    STOKER_RETURN_IF_ERROR(Check(interpreter, depth + 1).status());
    return path;
  }
  Elf64_Ehdr ehdr{};
  const bool elf = ::pread(fd, &ehdr, sizeof(ehdr), 0) == static_cast<ssize_t>(sizeof(ehdr)) &&
                   std::memcmp(ehdr.e_ident, ELFMAG, SELFMAG) == 0;
  if (!elf || ehdr.e_ident[EI_CLASS] != ELFCLASS64) {
    ::close(fd);
    return Status::FailedPrecondition(fmt::format("'{}' is not a 64-bit ELF program or a script", path));
  }
  bool dynamic = false;
  for (unsigned i = 0; i < ehdr.e_phnum && !dynamic; ++i) {
    Elf64_Phdr ph{};
    if (::pread(fd, &ph, sizeof(ph), static_cast<off_t>(ehdr.e_phoff + i * ehdr.e_phentsize)) != sizeof(ph)) break;
    dynamic = ph.p_type == PT_INTERP;
  }
  ::close(fd);
  if (!dynamic)
    return Status::FailedPrecondition(fmt::format(
        "'{}' is statically linked: it loads no preloaded library, so it could not be held to a GPU quota", path));
  return path;
}

}  // namespace

Result<std::string> CheckPreloadable(const std::string& command) {
  return Check(command, 0);
}

}  // namespace stoker
