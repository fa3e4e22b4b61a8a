#include "codec/number_array.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>

#include <fmt/format.h>

namespace stoker::codec {
namespace {

constexpr int kMaxDepth = 8;

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Result<NumberArray> Run() {
    NumberArray out;
    STOKER_RETURN_IF_ERROR(Value(0, out.values));
    SkipSpace();
    if (at_ != text_.size()) return Error("text after the array");
    // The lengths of the lists down to the numbers (or to the deepest list
    // when there are none: "[]" is shape [0]).
    const int depth = leaf_depth_ >= 0 ? leaf_depth_ : deepest_list_ + 1;
    for (int d = 0; d < depth; ++d) out.shape.push_back(lengths_[static_cast<std::size_t>(d)]);
    return out;
  }

 private:
  void SkipSpace() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n' || text_[at_] == '\r'))
      ++at_;
  }
  Status Error(std::string_view what) const {
    return Status::Corruption(fmt::format("not a JSON list of numbers: {} at byte {}", what, at_));
  }
  // Records (or checks) the length of the lists at `depth`.
  Status Length(int depth, std::size_t length) {
    auto& known = lengths_[static_cast<std::size_t>(depth)];
    if (known == kUnknown) known = length;
    if (known != length) return Error("lists of different lengths (a ragged array)");
    deepest_list_ = std::max(deepest_list_, depth);
    return Status::Ok();
  }
  Status Value(int depth, std::vector<double>& values) {
    SkipSpace();
    if (at_ >= text_.size()) return Error("end of text");
    if (text_[at_] == '[') {
      if (depth >= kMaxDepth) return Error("lists nested deeper than 8");
      if (leaf_depth_ >= 0 && depth >= leaf_depth_) return Error("a list where a number was");
      ++at_;
      std::size_t count = 0;
      SkipSpace();
      if (at_ < text_.size() && text_[at_] == ']') {
        ++at_;
        if (leaf_depth_ >= 0 && depth + 1 < leaf_depth_) return Error("an empty list where lists were");
        return Length(depth, 0);
      }
      for (;;) {
        STOKER_RETURN_IF_ERROR(Value(depth + 1, values));
        ++count;
        SkipSpace();
        if (at_ >= text_.size()) return Error("end of text inside a list");
        if (text_[at_] == ',') {
          ++at_;
          continue;
        }
        if (text_[at_] == ']') {
          ++at_;
          break;
        }
        return Error("expected ',' or ']'");
      }
      return Length(depth, count);
    }
    // A number: at the deepest level only, the same depth everywhere.
    if (leaf_depth_ < 0) {
      leaf_depth_ = depth;
    } else if (depth != leaf_depth_) {
      return Error("a number where a list was");
    }
    const char* begin = text_.data() + at_;
    const char* end = text_.data() + text_.size();
    double v = 0;
    const auto [stop, ec] = std::from_chars(begin, end, v);
    if (ec != std::errc() || stop == begin) return Error("expected a number or a list");
    if (!std::isfinite(v)) return Error("a number that is not finite");
    at_ += static_cast<std::size_t>(stop - begin);
    values.push_back(v);
    return Status::Ok();
  }

  static constexpr std::size_t kUnknown = static_cast<std::size_t>(-1);
  std::string_view text_;
  std::size_t at_ = 0;
  std::array<std::size_t, kMaxDepth + 1> lengths_ = [] {
    std::array<std::size_t, kMaxDepth + 1> a{};
    a.fill(kUnknown);
    return a;
  }();
  int deepest_list_ = -1;
  int leaf_depth_ = -1;
};

}  // namespace

Result<NumberArray> ParseNumberArray(std::string_view json) {
  Parser parser(json);
  STOKER_ASSIGN_OR_RETURN(NumberArray out, parser.Run());
  std::size_t expected = 1;
  for (auto d : out.shape) expected *= d;
  if (out.values.size() != expected) return Status::Corruption("not a JSON list of numbers: a ragged array");
  return out;
}

}  // namespace stoker::codec
