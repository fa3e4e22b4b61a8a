#include "format/webdataset.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include <fmt/format.h>

namespace stoker::wds {

// Implements WebDataset's base_plus_ext, the regular expression
// ^((?:.*/|)[^.]+)[.]([^/]*)$, without a regex engine: the '.' that splits key
// from field lies after the last '/', and the key must end in a run of
// non-dot characters that starts the name or follows a '/'.
std::optional<KeyAndField> SplitMemberName(std::string_view path) {
  const std::size_t last_slash = path.rfind('/');
  const std::size_t base = last_slash == std::string_view::npos ? 0 : last_slash + 1;
  const std::size_t dot = path.find('.', base);
  if (dot == std::string_view::npos) return std::nullopt;
  std::size_t key_end = dot;
  if (dot == base) {
    // A name like "dir/.hidden.jpg": the regex backtracks and takes "dir/"
    // as the key, provided the last directory component has no '.'.
    if (base == 0) return std::nullopt;
    std::size_t prev_slash = path.rfind('/', base >= 2 ? base - 2 : std::string_view::npos);
    if (base == 1) prev_slash = std::string_view::npos;
    std::string_view last_dir = path.substr(prev_slash == std::string_view::npos ? 0 : prev_slash + 1,
                                            base - (prev_slash == std::string_view::npos ? 0 : prev_slash + 1));
    if (last_dir.find('.') != std::string_view::npos) return std::nullopt;
    key_end = base;
  }
  KeyAndField out{std::string(path.substr(0, key_end)), std::string(path.substr(dot + 1))};
  std::transform(out.field.begin(), out.field.end(), out.field.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// WebDataset skips members matching __[^/]*__($|/): a first path component
// named __*__.
bool IsMetaMember(std::string_view path) {
  std::string_view first = path.substr(0, path.find('/'));
  return first.size() >= 4 && first.starts_with("__") && first.ends_with("__");
}

std::optional<std::int64_t> ParseLabel(std::string_view text) {
  auto is_space = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  if (text.empty()) return std::nullopt;
  std::int64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return value;
}

namespace {

constexpr std::size_t kMaxExpansion = 10'000'000;

Result<std::vector<std::string>> ExpandGroup(std::string_view body, std::string_view pattern) {
  std::vector<std::string> out;
  std::size_t dots = body.find("..");
  if (dots != std::string_view::npos && body.find(',') == std::string_view::npos) {
    std::string_view lo_text = body.substr(0, dots), hi_text = body.substr(dots + 2);
    std::uint64_t lo = 0, hi = 0;
    auto r1 = std::from_chars(lo_text.data(), lo_text.data() + lo_text.size(), lo);
    auto r2 = std::from_chars(hi_text.data(), hi_text.data() + hi_text.size(), hi);
    if (lo_text.empty() || hi_text.empty() || r1.ec != std::errc() || r2.ec != std::errc() ||
        r1.ptr != lo_text.data() + lo_text.size() || r2.ptr != hi_text.data() + hi_text.size()) {
      return Status::InvalidArgument(fmt::format("bad numeric range '{{{}}}' in pattern '{}'", body, pattern));
    }
    if (hi < lo)
      return Status::InvalidArgument(fmt::format("range '{{{}}}' in pattern '{}' runs backwards", body, pattern));
    if (hi - lo >= kMaxExpansion)
      return Status::InvalidArgument(fmt::format("range '{{{}}}' in pattern '{}' is too large", body, pattern));
    std::size_t width = lo_text.size();
    for (std::uint64_t i = lo; i <= hi; ++i) out.push_back(fmt::format("{:0{}}", i, width));
    return out;
  }
  std::size_t start = 0;
  while (true) {
    std::size_t comma = body.find(',', start);
    out.emplace_back(body.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace

Result<std::vector<std::string>> ExpandBraces(std::string_view pattern) {
  std::size_t open = pattern.find('{');
  if (open == std::string_view::npos) {
    if (pattern.find('}') != std::string_view::npos)
      return Status::InvalidArgument(fmt::format("unmatched '}}' in pattern '{}'", pattern));
    return std::vector<std::string>{std::string(pattern)};
  }
  std::size_t close = pattern.find('}', open);
  if (close == std::string_view::npos)
    return Status::InvalidArgument(fmt::format("unmatched '{{' in pattern '{}'", pattern));
  std::string_view body = pattern.substr(open + 1, close - open - 1);
  if (body.find('{') != std::string_view::npos)
    return Status::InvalidArgument(fmt::format("nested braces are not supported in pattern '{}'", pattern));
  STOKER_ASSIGN_OR_RETURN(auto choices, ExpandGroup(body, pattern));
  STOKER_ASSIGN_OR_RETURN(auto tails, ExpandBraces(pattern.substr(close + 1)));
  if (choices.size() * tails.size() > kMaxExpansion)
    return Status::InvalidArgument(fmt::format("pattern '{}' expands to too many names", pattern));
  std::vector<std::string> out;
  out.reserve(choices.size() * tails.size());
  std::string_view head = pattern.substr(0, open);
  for (const auto& c : choices)
    for (const auto& t : tails) out.push_back(fmt::format("{}{}{}", head, c, t));
  return out;
}

}  // namespace stoker::wds

namespace stoker::wds {

Status ForEachSample(std::span<const std::byte> archive, const std::string& where,
                     const std::function<Status(const TarSample&)>& on_sample,
                     const std::function<void(const SkippedMember&)>& on_skip) {
  tar::Reader reader(archive, where);
  std::optional<TarSample> current;
  auto skip = [&](const tar::Member& m, std::string_view why) {
    if (on_skip) on_skip({m.name, m.header_offset, why});
  };
  while (true) {
    STOKER_ASSIGN_OR_RETURN(auto member, reader.Next());
    if (!member) break;
    if (member->type != tar::MemberType::kRegular) {
      skip(*member, "not a regular file");
      continue;
    }
    if (IsMetaMember(member->name)) {
      skip(*member, "a __*__ name");
      continue;
    }
    auto split = SplitMemberName(member->name);
    if (!split) {
      skip(*member, "no extension, so no sample key");
      continue;
    }
    if (current && current->key != split->key) {
      STOKER_RETURN_IF_ERROR(on_sample(*current));
      current.reset();
    }
    if (!current) {
      current.emplace();
      current->key = split->key;
      current->header_offset = member->header_offset;
    }
    for (const auto& f : current->fields) {
      if (f.name == split->field) {
        return Status::Corruption(fmt::format("{}:{}: sample '{}' has field '{}' twice (member '{}')", where,
                                              member->header_offset, split->key, split->field, member->name));
      }
    }
    current->fields.push_back({std::move(split->field), member->header_offset, member->data_offset, member->size});
  }
  if (current) STOKER_RETURN_IF_ERROR(on_sample(*current));
  return Status::Ok();
}

}  // namespace stoker::wds
