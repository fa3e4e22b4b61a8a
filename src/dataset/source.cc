#include "dataset/source.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>

#include "format/manifest.h"
#include "format/webdataset.h"
#include "stoker/dataset.h"
#include "stoker/text.h"

namespace stoker::pack_internal {
namespace {

// torchvision.datasets.folder.IMG_EXTENSIONS
constexpr std::array<std::string_view, 9> kImageExtensions = {"jpg", "jpeg", "png",  "ppm", "bmp",
                                                              "pgm", "tif",  "tiff", "webp"};

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string Join(const std::string& dir, const std::string& name) {
  return dir.empty() ? name : dir + "/" + name;
}

// Splits "a/b.c.JPG" into {"a/b.c", "jpg"}; false when the last component has no extension.
bool SplitExtension(std::string_view relative, std::string* stem, std::string* ext) {
  std::size_t slash = relative.rfind('/');
  std::size_t base = slash == std::string_view::npos ? 0 : slash + 1;
  std::size_t dot = relative.rfind('.');
  if (dot == std::string_view::npos || dot <= base || dot + 1 == relative.size()) return false;
  *stem = std::string(relative.substr(0, dot));
  *ext = Lower(relative.substr(dot + 1));
  return true;
}

FieldSource LabelField(std::int64_t label) {
  FieldSource f;
  f.name = "cls";
  f.kind = FieldSource::Kind::kInline;
  f.text = std::to_string(label);
  f.content = FieldKind::kInt;
  return f;
}

// Recursively collects regular files under root/rel as (dir, name) pairs.
Status Walk(FileSystem& fs, const std::string& root, const std::string& rel,
            std::vector<std::pair<std::string, std::string>>& out, int depth) {
  if (depth > 64)
    return Status::InvalidArgument(fmt::format("'{}' is nested too deeply (a symlink loop?)", Join(root, rel)));
  STOKER_ASSIGN_OR_RETURN(auto entries, fs.ListDirectory(Join(root, rel)));
  for (auto& e : entries) {
    if (e.type == FileType::kDirectory) {
      STOKER_RETURN_IF_ERROR(Walk(fs, root, Join(rel, e.name), out, depth + 1));
    } else if (e.type == FileType::kRegular) {
      out.emplace_back(rel, e.name);
    } else if (e.type == FileType::kSymlink) {
      // A link that leads nowhere: the file system says whether it dangles
      // or is part of a loop of links.
      const std::string path = Join(Join(root, rel), e.name);
      auto info = fs.Stat(path);
      if (!info.ok()) return info.error();
      return Status::NotFound(fmt::format("'{}' is a symbolic link that leads nowhere", path));
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::string> KeyFromRelativePath(std::string_view path) {
  std::size_t slash = path.rfind('/');
  std::size_t base = slash == std::string_view::npos ? 0 : slash + 1;
  std::string key(path);
  std::replace(key.begin() + static_cast<std::ptrdiff_t>(base), key.end(), '.', '_');
  if (base == key.size()) return Status::InvalidArgument(fmt::format("cannot make a sample key from '{}'", path));
  return key;
}

Result<SourceListing> ListImageFolder(FileSystem& fs, const std::string& root) {
  SourceListing listing;
  STOKER_ASSIGN_OR_RETURN(auto entries, fs.ListDirectory(root));
  std::size_t loose_files = 0;
  for (const auto& e : entries) {
    if (e.type == FileType::kDirectory)
      listing.class_names.push_back(e.name);
    else
      ++loose_files;
  }
  std::sort(listing.class_names.begin(), listing.class_names.end());
  if (listing.class_names.empty()) {
    return Status::InvalidArgument(
        fmt::format("'{}' has no class sub-folders (expected ImageFolder layout: {}/<class>/<image>)", root, root));
  }
  if (loose_files > 0)
    listing.warnings.push_back(fmt::format("ignored {} at the top of '{}' that {}",
                                           Counted(loose_files, "entry", "entries"), root,
                                           loose_files == 1 ? "is not a class folder" : "are not class folders"));
  std::size_t not_images = 0;
  std::string example;
  for (std::size_t label = 0; label < listing.class_names.size(); ++label) {
    const std::string& cls = listing.class_names[label];
    std::vector<std::pair<std::string, std::string>> files;
    STOKER_RETURN_IF_ERROR(Walk(fs, root, cls, files, 0));
    std::sort(files.begin(), files.end());  // as torchvision: sorted(os.walk(...)), then sorted(fnames)
    std::size_t before = listing.samples.size();
    for (const auto& [dir, name] : files) {
      std::string rel = Join(dir, name);
      if (name.starts_with(".")) {
        ++not_images;
        if (example.empty()) example = rel;
        continue;
      }
      std::string stem, ext;
      if (!SplitExtension(rel, &stem, &ext)) {
        return Status::InvalidArgument(fmt::format(
            "'{}' has no file extension; cannot tell what it holds (rename it, or remove it from the class folder)",
            Join(root, rel)));
      }
      if (std::find(kImageExtensions.begin(), kImageExtensions.end(), ext) == kImageExtensions.end()) {
        ++not_images;
        if (example.empty()) example = rel;
        continue;
      }
      SourceSample s;
      STOKER_ASSIGN_OR_RETURN(s.key, KeyFromRelativePath(stem));
      s.label = static_cast<std::int64_t>(label);
      s.origin = Join(root, rel);
      s.fields.push_back(LabelField(s.label));
      FieldSource image;
      image.name = ext;
      image.path = s.origin;
      image.content = ConventionalFieldKind(ext);
      s.fields.push_back(std::move(image));
      std::sort(s.fields.begin(), s.fields.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
      listing.samples.push_back(std::move(s));
    }
    if (listing.samples.size() == before) {
      return Status::InvalidArgument(fmt::format("class folder '{}' holds no image files (extensions: {})",
                                                 Join(root, cls), fmt::join(kImageExtensions, ", ")));
    }
  }
  if (not_images > 0) {
    listing.warnings.push_back(fmt::format(
        "skipped {}, as torchvision's ImageFolder does (e.g. '{}')",
        Counted(not_images, "file that is not an image or is hidden", "files that are not images or are hidden"),
        example));
  }
  // Every extension torchvision's ImageFolder reads is one stoker's loader decodes.
  return listing;
}

Result<SourceListing> ListManifest(FileSystem& fs, const std::string& manifest_path,
                                   std::span<const std::string> file_columns) {
  STOKER_ASSIGN_OR_RETURN(auto bytes, ReadWholeFile(fs, manifest_path));
  std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  const bool is_csv = Lower(std::filesystem::path(manifest_path).extension().string()) == ".csv";
  auto rows = is_csv ? manifest::ParseCsv(text, manifest_path, file_columns)
                     : manifest::ParseJsonLines(text, manifest_path, file_columns);
  if (!rows.ok()) return rows.error();
  if (rows->empty()) return Status::InvalidArgument(fmt::format("{}: the manifest lists no files", manifest_path));
  const std::string base = std::filesystem::path(manifest_path).parent_path().string();

  // Labels: integers when every given label is one, otherwise class names.
  bool all_integers = true;
  std::set<std::string> names;
  for (const auto& row : *rows) {
    if (row.label.empty()) continue;
    names.insert(row.label);
    if (!wds::ParseLabel(row.label)) all_integers = false;
  }
  SourceListing listing;
  std::map<std::string, std::int64_t> class_ids;
  if (!all_integers) {
    for (const auto& n : names) {
      class_ids[n] = static_cast<std::int64_t>(listing.class_names.size());
      listing.class_names.push_back(n);
    }
  }
  for (const auto& row : *rows) {
    std::string where = fmt::format("{}:{}", manifest_path, row.line);
    SourceSample s;
    s.origin = where;
    std::string key_stem;
    for (const auto& [column, path] : row.files) {
      std::string stem, ext;
      if (!SplitExtension(path, &stem, &ext)) {
        return Status::InvalidArgument(
            fmt::format("{}: {} '{}' has no file extension, so its field name is unknown", where, column, path));
      }
      if (key_stem.empty()) key_stem = stem;
      FieldSource file;
      file.name = column == "path" ? ext : column + "." + ext;
      file.path = path.starts_with("/") || base.empty() ? path : base + "/" + path;
      file.content = ConventionalFieldKind(file.name);
      s.fields.push_back(std::move(file));
    }
    if (!row.key.empty()) {
      s.key = row.key;
      if (!wds::SplitMemberName(s.key + ".x") || wds::SplitMemberName(s.key + ".x")->key != s.key)
        return Status::InvalidArgument(fmt::format("{}: key '{}' contains '.' in its last component", where, s.key));
    } else {
      std::string_view rel = key_stem;
      while (rel.starts_with("/")) rel.remove_prefix(1);
      while (rel.starts_with("./")) rel.remove_prefix(2);
      auto key = KeyFromRelativePath(rel);
      if (!key.ok()) return key.error().WithContext(where);
      s.key = std::move(key).value();
    }
    s.label = kNoLabel;
    if (!row.label.empty()) {
      s.label = all_integers ? *wds::ParseLabel(row.label) : class_ids[row.label];
      s.fields.push_back(LabelField(s.label));
    }
    for (const auto& value : row.extra) {
      const std::string& name = value.column;
      if (name.empty() || name.find('/') != std::string::npos || name.find_first_of(" \t") != std::string::npos)
        return Status::InvalidArgument(fmt::format("{}: column '{}' is not usable as a field name", where, name));
      FieldSource f;
      f.name = name;
      f.kind = FieldSource::Kind::kInline;
      f.text = value.text;
      switch (value.type) {
        case manifest::ValueType::kString:
          f.content = FieldKind::kText;
          break;
        case manifest::ValueType::kInteger:
          f.content = FieldKind::kInt;
          break;
        case manifest::ValueType::kNumber:
          f.content = FieldKind::kFloat;
          break;
        case manifest::ValueType::kJson:
          f.content = FieldKind::kJson;
          break;
      }
      s.fields.push_back(std::move(f));
    }
    std::sort(s.fields.begin(), s.fields.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    for (std::size_t i = 1; i < s.fields.size(); ++i) {
      if (s.fields[i].name == s.fields[i - 1].name)
        return Status::InvalidArgument(
            fmt::format("{}: field '{}' appears twice in one sample (an extra column clashes "
                        "with a file's field or 'cls')",
                        where, s.fields[i].name));
    }
    listing.samples.push_back(std::move(s));
  }
  return listing;
}

Result<SourceListing> ListTarShards(FileSystem& fs, const std::string& pattern) {
  STOKER_ASSIGN_OR_RETURN(auto paths, wds::ExpandBraces(pattern));
  return ListTarFiles(fs, paths);
}

Result<SourceListing> ListTarFiles(FileSystem& fs, std::span<const std::string> paths) {
  SourceListing listing;
  std::uint64_t skipped = 0;
  std::string first_skipped;
  for (const auto& path : paths) {
    STOKER_ASSIGN_OR_RETURN(auto mapped, fs.Map(path));
    Status s = wds::ForEachSample(
        mapped->data(), path,
        [&](const wds::TarSample& ts) -> Status {
          SourceSample sample;
          sample.key = ts.key;
          sample.label = kNoLabel;
          sample.origin = fmt::format("{}:{}", path, ts.header_offset);
          for (const auto& f : ts.fields) {
            FieldSource src;
            src.name = f.name;
            src.kind = FieldSource::Kind::kRange;
            src.path = path;
            src.offset = f.data_offset;
            src.size = f.size;
            src.content = ConventionalFieldKind(f.name);
            if (f.name == "cls") {
              auto bytes = mapped->data().subspan(f.data_offset, f.size);
              auto label = wds::ParseLabel({reinterpret_cast<const char*>(bytes.data()), bytes.size()});
              if (!label) {
                return Status::Corruption(
                    fmt::format("{}:{}: sample '{}': .cls is not a decimal integer", path, f.header_offset, ts.key));
              }
              sample.label = *label;
            }
            sample.fields.push_back(std::move(src));
          }
          std::sort(sample.fields.begin(), sample.fields.end(),
                    [](const auto& a, const auto& b) { return a.name < b.name; });
          listing.samples.push_back(std::move(sample));
          return Status::Ok();
        },
        [&](const wds::SkippedMember& m) {
          if (skipped++ < 20)
            listing.warnings.push_back(fmt::format("{}:{}: member '{}' left out as WebDataset leaves it out ({})", path,
                                                   m.header_offset, Printable(m.name), m.why));
        });
    STOKER_RETURN_IF_ERROR(s);
  }
  if (skipped > 20)
    listing.warnings.push_back(
        fmt::format("... and {} more members left out as WebDataset leaves them out", skipped - 20));
  return listing;
}

}  // namespace stoker::pack_internal
