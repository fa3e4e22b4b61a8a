#include "pipeline/field_extension.h"

#include <dlfcn.h>

#include <cstring>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/mutex.h"

namespace stoker {
namespace {

struct Registry {
  Mutex mu;
  std::map<std::string, StokerFieldDecodeFn, std::less<>> decoders GUARDED_BY(mu);
  std::set<std::string> loaded GUARDED_BY(mu);  // paths; their libraries stay loaded for good
};

Registry& TheRegistry() {
  static Registry* registry = new Registry();  // never destroyed: decoders may run at exit
  return *registry;
}

// A bound on one value: a decoder asking for more is refused, not obeyed.
constexpr std::uint64_t kMaxValueBytes = std::uint64_t{1} << 34;

struct OutputContext {
  FieldValue* out;
  bool produced = false;
  std::string error;
};

void* Tensor(void* ctx, int dtype, int ndim, const int64_t* shape) {
  auto* c = static_cast<OutputContext*>(ctx);
  if (c->produced || dtype < STOKER_BOOL || dtype > STOKER_FLOAT64 || ndim < 0 || ndim > 32 ||
      (ndim > 0 && shape == nullptr))
    return nullptr;
  const auto type = static_cast<ElementType>(dtype);  // the same order as StokerDType
  std::uint64_t bytes = ElementSize(type);
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] < 0 || __builtin_mul_overflow(bytes, static_cast<std::uint64_t>(shape[d]), &bytes)) return nullptr;
  }
  if (bytes > kMaxValueBytes) return nullptr;
  c->out->tensor.type = type;
  c->out->tensor.shape.assign(shape, shape + ndim);
  c->out->tensor.data.resize(bytes);
  c->produced = true;
  // A non-null pointer even for an empty tensor.
  return bytes == 0 ? static_cast<void*>(c) : c->out->tensor.data.data();
}

void Bytes(void* ctx, const void* data, size_t size) {
  auto* c = static_cast<OutputContext*>(ctx);
  if (c->produced || (data == nullptr && size > 0) || size > kMaxValueBytes) return;
  c->out->bytes.assign(static_cast<const char*>(data), size);
  c->produced = true;
}

void Error(void* ctx, const char* message) {
  auto* c = static_cast<OutputContext*>(ctx);
  c->error = message != nullptr ? std::string(message).substr(0, 1000) : "";
}

}  // namespace

Status LoadFieldExtension(const std::string& path) {
  Registry& r = TheRegistry();
  MutexLock lock(r.mu);
  if (r.loaded.contains(path)) return Status::Ok();
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    return Status::NotFound(fmt::format("field extension '{}' does not load: {}", path, why ? why : "?"));
  }
  auto entry = reinterpret_cast<StokerFieldDecodersFn>(::dlsym(handle, "stoker_field_decoders"));
  if (entry == nullptr)
    return Status::InvalidArgument(
        fmt::format("'{}' exports no stoker_field_decoders (see stoker/field_extension.h)", path));
  const StokerFieldDecoder* table = nullptr;
  size_t count = 0;
  if (entry(&table, &count) != 0 || (table == nullptr && count > 0))
    return Status::InvalidArgument(fmt::format("'{}': stoker_field_decoders failed", path));
  std::vector<std::pair<std::string, StokerFieldDecodeFn>> found;
  for (size_t i = 0; i < count; ++i) {
    const StokerFieldDecoder& d = table[i];
    if (d.version != STOKER_FIELD_EXTENSION_VERSION)
      return Status::InvalidArgument(fmt::format("'{}': decoder {} is of interface version {}, stoker's is {}", path, i,
                                                 d.version, STOKER_FIELD_EXTENSION_VERSION));
    if (d.name == nullptr || *d.name == '\0' || d.decode == nullptr)
      return Status::InvalidArgument(fmt::format("'{}': decoder {} has no name or no function", path, i));
    if (r.decoders.contains(d.name))
      return Status::InvalidArgument(
          fmt::format("'{}': a decoder named '{}' is registered already (by another library)", path, d.name));
    found.emplace_back(d.name, d.decode);
  }
  for (auto& [name, fn] : found) r.decoders.emplace(std::move(name), fn);
  r.loaded.insert(path);
  return Status::Ok();
}

std::vector<std::string> FieldExtensionDecoders() {
  Registry& r = TheRegistry();
  MutexLock lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [name, fn] : r.decoders) names.push_back(name);
  return names;
}

namespace pipeline {

Result<StokerFieldDecodeFn> FindFieldExtension(std::string_view name) {
  Registry& r = TheRegistry();
  MutexLock lock(r.mu);
  const auto it = r.decoders.find(name);
  if (it != r.decoders.end()) return it->second;
  std::vector<std::string> names;
  for (const auto& [n, fn] : r.decoders) names.push_back(n);
  return Status::NotFound(fmt::format("no field decoder '{}' is loaded (loaded: {}; stoker.load_field_extension)", name,
                                      names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "))));
}

Status DecodeCustomField(std::span<const std::byte> bytes, const FieldSpec& spec, const FieldDecodeOptions& options,
                         FieldValue* out) {
  if (options.custom == nullptr) return Status::Internal(fmt::format("field '{}': no decoder resolved", spec.name));
  OutputContext ctx{out, false, {}};
  out->tensor = {};
  out->bytes.clear();
  StokerFieldOutput output{&ctx, Tensor, Bytes, Error};
  const int r = options.custom(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &output);
  if (r != 0)
    return Status::Corruption(
        fmt::format("decoder '{}': {}", spec.decoder, ctx.error.empty() ? fmt::format("failed ({})", r) : ctx.error));
  if (!ctx.produced)
    return Status::Corruption(
        fmt::format("decoder '{}' returned success without a value (or one it was refused: "
                    "a bad dtype or shape, or over 16 GiB)",
                    spec.decoder));
  return Status::Ok();
}

}  // namespace pipeline
}  // namespace stoker
