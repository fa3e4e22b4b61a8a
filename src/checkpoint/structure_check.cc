#include "checkpoint/structure_check.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace stoker::checkpoint {
namespace {

using Json = nlohmann::json;

// SAX handler: follows the depth, notices the top-level "structure" member,
// and inside it checks every string that is the value of a "t" key.
class StructureReader {
 public:
  StructureReader(const TensorIndex& tensors, safetensors::ParseWork* work) : tensors_(tensors), work_(work) {}

  [[nodiscard]] const std::string& missing() const { return missing_; }

  bool null() { return Scalar(); }
  bool boolean(bool) { return Scalar(); }
  bool number_integer(Json::number_integer_t) { return Scalar(); }
  bool number_unsigned(Json::number_unsigned_t) { return Scalar(); }
  bool number_float(Json::number_float_t, const Json::string_t&) { return Scalar(); }
  bool binary(Json::binary_t&) { return Scalar(); }
  bool string(Json::string_t& value) {
    if (in_structure_ && key_is_t_) {
      if (work_) ++work_->name_lookups;
      if (!tensors_.contains(value)) {
        missing_ = value;
        return false;
      }
    }
    return Scalar();
  }
  bool start_object(std::size_t) { return Open(); }
  bool start_array(std::size_t) { return Open(); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }
  bool key(Json::string_t& key) {
    key_is_t_ = key == "t";
    key_is_structure_ = depth_ == 1 && key == "structure";
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) { return false; }

 private:
  bool Scalar() {
    key_is_t_ = key_is_structure_ = false;
    return true;
  }
  bool Open() {
    ++depth_;
    if (key_is_structure_) {
      in_structure_ = true;
      structure_depth_ = depth_;
    }
    return Scalar();
  }
  bool Close() {
    if (in_structure_ && depth_ == structure_depth_) in_structure_ = false;
    --depth_;
    return Scalar();
  }

  const TensorIndex& tensors_;
  safetensors::ParseWork* work_;
  int depth_ = 0;
  bool in_structure_ = false;
  int structure_depth_ = 0;
  bool key_is_t_ = false;          // the value that comes next is a "t" member's
  bool key_is_structure_ = false;  // ... the top-level "structure" member's
  std::string missing_;
};

}  // namespace

Status CheckStructure(std::string_view user_json, const TensorIndex& tensors, const std::string& where,
                      safetensors::ParseWork* work) {
  if (user_json.empty()) return Status::Ok();
  if (work) work->json_bytes += user_json.size();
  StructureReader reader(tensors, work);
  if (Json::sax_parse(user_json, &reader, nlohmann::detail::input_format_t::json, /*strict=*/true)) return Status::Ok();
  if (!reader.missing().empty())
    return Status::Corruption(
        fmt::format("checkpoint '{}': its manifest's state structure names tensor '{}', which none of its files holds",
                    where, reader.missing()));
  return Status::Corruption(fmt::format("checkpoint '{}': its manifest's user document is not valid JSON", where));
}

}  // namespace stoker::checkpoint
