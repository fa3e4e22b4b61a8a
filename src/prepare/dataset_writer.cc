#include "stoker/dataset_writer.h"

#include <algorithm>

#include <fmt/format.h>

#include "codec/image_decode.h"
#include "dataset/shard_sink.h"
#include "format/index_format.h"
#include "format/index_note.h"
#include "format/webdataset.h"
#include "prepare/image_check.h"
#include "stoker/text.h"

namespace stoker {
namespace {

using pack_internal::ShardSink;

// What makes `key` unusable as a WebDataset key, beyond ValidateKey's rules
// (empty for nothing).
std::string KeyProblem(std::string_view key) {
  const auto slash = key.rfind('/');
  const std::string_view last = slash == std::string_view::npos ? key : key.substr(slash + 1);
  if (last.find('.') != std::string_view::npos)
    return fmt::format(
        "has a '.' in its last part '{}'; WebDataset splits a member's name at the first '.' there, so the key "
        "read back would differ (use '_' instead)",
        Printable(last));
  if (wds::IsMetaMember(key)) return "starts with a part named __*__, which WebDataset skips as metadata";
  return "";
}

std::string FieldProblem(std::string_view name) {
  if (name.empty()) return "is empty";
  if (name.find('/') != std::string_view::npos) return "holds a '/'";
  if (std::any_of(name.begin(), name.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
    return "holds control characters";
  if (std::any_of(name.begin(), name.end(), [](char c) { return c >= 'A' && c <= 'Z'; }))
    return "has upper-case letters; WebDataset lower-cases field names as it reads them";
  return "";
}

}  // namespace

struct DatasetWriter::Impl {
  explicit Impl(bool keep) : keep_bad_images(keep), images(keep, "keep_bad_images") {}
  const bool keep_bad_images;
  std::unique_ptr<ShardSink> sink;
  std::vector<std::string> class_names;
  // Image fields checked as pack checks them: the loader would fail on them later.
  prepare::ImageHeaderCheck images;
};

DatasetWriter::DatasetWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DatasetWriter::~DatasetWriter() = default;

Result<std::unique_ptr<DatasetWriter>> DatasetWriter::Create(const std::string& out_dir,
                                                             const DatasetWriterOptions& options) {
  if (out_dir.empty()) return Status::InvalidArgument("the output folder is empty");
  auto impl = std::make_unique<Impl>(options.keep_bad_images);
  STOKER_ASSIGN_OR_RETURN(
      impl->sink, ShardSink::Create(*options.file_system, out_dir, options.target_shard_bytes, options.overwrite,
                                    "pass overwrite=True (stoker pack: --force)"));
  impl->class_names = options.class_names;
  return std::unique_ptr<DatasetWriter>(new DatasetWriter(std::move(impl)));
}

Status DatasetWriter::Add(std::string_view key, std::span<const SampleField> fields) {
  const std::string where = fmt::format("sample {}", impl_->sink->samples());
  STOKER_RETURN_IF_ERROR(pack_internal::ValidateKey(key, where));
  if (std::string why = KeyProblem(key); !why.empty())
    return Status::InvalidArgument(fmt::format("{}: sample key '{}' {}", where, Printable(key), why));
  if (fields.empty())
    return Status::InvalidArgument(
        fmt::format("sample '{}' has no fields; a sample needs at least one", Printable(key)));
  std::int64_t label = index_format::kNoLabel;
  std::vector<ShardSink::Field> out;
  out.reserve(fields.size());
  for (const SampleField& f : fields) {
    if (std::string why = FieldProblem(f.name); !why.empty())
      return Status::InvalidArgument(
          fmt::format("sample '{}': field name '{}' {}", Printable(key), Printable(f.name), why));
    // The reader's own rule must give back this key and field.
    const auto split = wds::SplitMemberName(fmt::format("{}.{}", key, f.name));
    if (!split || split->key != key || split->field != f.name)
      return Status::InvalidArgument(fmt::format("sample '{}': field '{}' would not read back as this key and field",
                                                 Printable(key), Printable(f.name)));
    if (f.name == "cls") {
      const auto parsed = wds::ParseLabel({reinterpret_cast<const char*>(f.bytes.data()), f.bytes.size()});
      if (!parsed)
        return Status::InvalidArgument(fmt::format(
            "sample '{}': 'cls' is the label and must be a decimal integer, not '{}'", Printable(key),
            Printable({reinterpret_cast<const char*>(f.bytes.data()), std::min<std::size_t>(f.bytes.size(), 40)})));
      label = *parsed;
    }
    out.push_back({f.name, f.bytes, f.kind, nullptr});
  }
  // Image fields last, once the sample is otherwise good; a kept bad one is
  // recorded only once its sample is written (a key given twice is not).
  std::vector<std::pair<const SampleField*, Status>> bad;
  for (const SampleField& f : fields) {
    if (f.kind != FieldKind::kImage) continue;
    Status why = codec::CheckImageHeader(f.bytes);
    if (why.ok()) continue;
    if (!impl_->keep_bad_images) {
      const auto refused = impl_->images.Bad({key, f.name, f.kind}, why);  // the error, with how to keep them
      return Status::InvalidArgument(
          fmt::format("sample '{}', field '{}': {}", Printable(key), Printable(f.name), refused.status().message()));
    }
    bad.emplace_back(&f, std::move(why));
  }
  STOKER_RETURN_IF_ERROR(impl_->sink->Add(key, label, out));
  for (const auto& [f, why] : bad) (void)impl_->images.Bad({key, f->name, f->kind}, why);
  return Status::Ok();
}

std::uint64_t DatasetWriter::samples() const {
  return impl_->sink->samples();
}

std::uint64_t DatasetWriter::payload_bytes() const {
  return impl_->sink->payload_bytes();
}

Result<PackSummary> DatasetWriter::Finish() {
  const std::string note = index_format::NoteWithClassNames(impl_->images.Note(), impl_->class_names);
  STOKER_ASSIGN_OR_RETURN(PackSummary summary, impl_->sink->Finish(note));
  impl_->images.Report(summary);
  summary.class_names = impl_->class_names;
  summary.note = note;
  return summary;
}

}  // namespace stoker
