#include "dataset/index_file.h"

namespace stoker {
namespace {

class AtomicFileSink final : public index_format::ByteSink {
 public:
  explicit AtomicFileSink(AtomicFile& file) : file_(&file) {}
  [[nodiscard]] Status Write(std::span<const std::byte> bytes) override { return file_->Append(bytes); }

 private:
  AtomicFile* file_;
};

}  // namespace

Status WriteIndexFile(FileSystem& fs, const std::string& path,
                      const std::function<Status(index_format::ByteSink&)>& write) {
  STOKER_ASSIGN_OR_RETURN(AtomicFile file, AtomicFile::Create(fs, path));
  AtomicFileSink sink(file);
  STOKER_RETURN_IF_ERROR(write(sink));
  return file.Commit();
}

}  // namespace stoker
