// Fields for Python: the single-field decoders (stoker/decode.h), whose
// values come back as a DLPack capsule plus NumPy's name for their element
// type; the FieldSpec a loader takes; and a batch's decoded fields.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "common.h"
#include "stoker/decode.h"
#include "stoker/fields.h"
#include "stoker/loader.h"

namespace stoker_python {
namespace {

// Torch before 2.3 has no uint16, uint32 or uint64: such arrays are widened
// to the next signed type that holds every value (uint64 values past
// int64's range are refused rather than wrapped). The type they arrive as.
stoker::ElementType WidenedForTorch(stoker::ElementType type) {
  switch (type) {
    case stoker::ElementType::kUInt16:
      return stoker::ElementType::kInt32;
    case stoker::ElementType::kUInt32:
    case stoker::ElementType::kUInt64:
      return stoker::ElementType::kInt64;
    default:
      return type;
  }
}

// Copies `n` elements of `type` from `from` to `to` as WidenedForTorch(type)
// holds them. Both are aligned to their element types (vector and array
// allocations, at whole-element offsets): typed loops the compiler
// vectorises (this file builds at -O3).
stoker::Status CopyWidened(stoker::ElementType type, const std::byte* from, std::uint64_t n, std::byte* to) {
  const auto widen = [&]<typename From, typename To>() -> stoker::Status {
    const auto* __restrict source = reinterpret_cast<const From*>(from);
    auto* __restrict target = reinterpret_cast<To*>(to);
    if constexpr (sizeof(From) == sizeof(To)) {
      From largest = 0;
      for (std::uint64_t i = 0; i < n; ++i) largest = std::max(largest, source[i]);
      if (largest > static_cast<From>(std::numeric_limits<To>::max()))
        return stoker::Status::InvalidArgument(
            "a uint64 array holds a value past int64's range, and this torch has no uint64 tensors");
    }
    for (std::uint64_t i = 0; i < n; ++i) target[i] = static_cast<To>(source[i]);
    return stoker::Status::Ok();
  };
  switch (type) {
    case stoker::ElementType::kUInt16:
      return widen.operator()<std::uint16_t, std::int32_t>();
    case stoker::ElementType::kUInt32:
      return widen.operator()<std::uint32_t, std::int64_t>();
    case stoker::ElementType::kUInt64:
      return widen.operator()<std::uint64_t, std::int64_t>();
    default:
      if (n != 0) std::memcpy(to, from, n * stoker::ElementSize(type));
      return stoker::Status::Ok();
  }
}

stoker::Status WidenForTorch(stoker::HostTensor& t) {
  const stoker::ElementType to = WidenedForTorch(t.type);
  if (to == t.type) return stoker::Status::Ok();
  std::vector<std::byte> wide(t.elements() * stoker::ElementSize(to));
  STOKER_RETURN_IF_ERROR(CopyWidened(t.type, t.data.data(), t.elements(), wide.data()));
  t.data = std::move(wide);
  t.type = to;
  return stoker::Status::Ok();
}

DLDataType ToDL(stoker::ElementType type) {
  const auto bits = static_cast<std::uint8_t>(8 * stoker::ElementSize(type));
  switch (type) {
    case stoker::ElementType::kBool:  // torch 1.13 reads no kDLBool: uint8, made bool in Python
    case stoker::ElementType::kUInt8:
    case stoker::ElementType::kUInt16:
    case stoker::ElementType::kUInt32:
    case stoker::ElementType::kUInt64:
      return {kDLUInt, bits, 1};
    case stoker::ElementType::kInt8:
    case stoker::ElementType::kInt16:
    case stoker::ElementType::kInt32:
    case stoker::ElementType::kInt64:
      return {kDLInt, bits, 1};
    case stoker::ElementType::kFloat16:
    case stoker::ElementType::kFloat32:
    case stoker::ElementType::kFloat64:
      return {kDLFloat, bits, 1};
  }
  return {kDLUInt, 8, 1};
}

py::tuple ToPython(stoker::HostTensor t, bool torch_has_unsigned) {
  const std::string_view stored = stoker::ElementTypeName(t.type);
  if (!torch_has_unsigned) Check(WidenForTorch(t));
  auto owner = std::make_shared<stoker::HostTensor>(std::move(t));
  void* data = owner->data.data();
  const DLDataType dtype = ToDL(owner->type);
  std::vector<std::int64_t> shape = owner->shape;
  return py::make_tuple(MakeCapsule(owner, data, std::move(shape), dtype), std::string(stored),
                        std::string(stoker::ElementTypeName(owner->type)));
}

std::span<const std::byte> BytesOf(const py::bytes& b, std::string_view* keep) {
  *keep = b;
  return {reinterpret_cast<const std::byte*>(keep->data()), keep->size()};
}

// One sample's tensor as a capsule owned by `owner` (the batch: no copy).
py::object TensorCapsule(const std::shared_ptr<void>& owner, const stoker::HostTensor& t) {
  return MakeCapsule(owner, const_cast<std::byte*>(t.data.data()), t.shape, ToDL(t.type));
}

// An Array or Mask column whose values are all present, of one shape and type, as
// one tensor [B, ...] (widened for torch as a sample's would be), copied in
// one pass without the GIL into memory that is not zeroed first: Python
// then makes no tensor a sample and stacks nothing.
struct StackedColumn {
  std::shared_ptr<std::byte[]> data;
  std::vector<std::int64_t> shape;
  stoker::ElementType type;
};
std::optional<StackedColumn> Stacked(std::span<const stoker::FieldValue> values) {
  if (values.empty() || !values[0].present) return std::nullopt;
  const stoker::HostTensor& first = values[0].tensor;
  for (const stoker::FieldValue& v : values)
    if (!v.present || v.tensor.type != first.type || v.tensor.shape != first.shape) return std::nullopt;
  StackedColumn out;
  out.type = WidenedForTorch(first.type);
  out.shape.push_back(static_cast<std::int64_t>(values.size()));
  out.shape.insert(out.shape.end(), first.shape.begin(), first.shape.end());
  const std::uint64_t per_sample = first.elements();
  const std::size_t sample_bytes = per_sample * stoker::ElementSize(out.type);
  stoker::Status copied;
  {
    py::gil_scoped_release release;
    out.data = std::make_shared_for_overwrite<std::byte[]>(std::max<std::size_t>(1, sample_bytes * values.size()));
    for (std::size_t j = 0; j < values.size() && copied.ok(); ++j)
      copied = CopyWidened(first.type, values[j].tensor.data.data(), per_sample, out.data.get() + j * sample_bytes);
  }
  Check(copied);  // raises: with the GIL held
  return out;
}

}  // namespace

py::object FieldsToPython(stoker::Batch& batch, const std::shared_ptr<void>& owner) {
  if (batch.num_fields() == 0) return py::none();
  py::list out;
  const auto& specs = batch.field_specs();
  for (std::size_t f = 0; f < batch.num_fields(); ++f) {
    const stoker::FieldSpec& spec = specs[f];
    const auto values = batch.field(f);
    if (spec.kind == stoker::FieldKind::kArray || spec.kind == stoker::FieldKind::kMask) {
      if (auto stacked = Stacked(values)) {  // a tuple (capsule, stored type, delivered type), not a list
        const std::string stored(stoker::ElementTypeName(values[0].tensor.type));
        batch.ReleaseField(f);  // copied: the slot need not keep a second copy while the loop uses this one
        void* data = stacked->data.get();
        py::capsule capsule =
            MakeCapsule(std::shared_ptr<void>(stacked->data, data), data, stacked->shape, ToDL(stacked->type));
        out.append(py::make_tuple(capsule, stored, std::string(stoker::ElementTypeName(stacked->type))));
        continue;
      }
    }
    py::list column;
    for (const stoker::FieldValue& v : values) {
      if (!v.present) {
        column.append(py::none());
        continue;
      }
      switch (spec.kind) {
        case stoker::FieldKind::kInt: {
          std::int64_t x = 0;
          std::memcpy(&x, v.tensor.data.data(), sizeof(x));
          column.append(py::int_(x));
          break;
        }
        case stoker::FieldKind::kFloat: {
          double x = 0;
          std::memcpy(&x, v.tensor.data.data(), sizeof(x));
          column.append(py::float_(x));
          break;
        }
        case stoker::FieldKind::kCustom:
          if (v.tensor.data.empty() && v.tensor.shape.empty()) {  // it handed over bytes
            column.append(py::bytes(v.bytes.data(), v.bytes.size()));
            break;
          }
          [[fallthrough]];
        case stoker::FieldKind::kImage:
        case stoker::FieldKind::kArray:
        case stoker::FieldKind::kBoxes:
        case stoker::FieldKind::kKeypoints:
        case stoker::FieldKind::kMask: {
          // Types torch 1.13 cannot take are widened (a copy, owned by the capsule).
          const auto type = v.tensor.type;
          if (type == stoker::ElementType::kUInt16 || type == stoker::ElementType::kUInt32 ||
              type == stoker::ElementType::kUInt64) {
            column.append(ToPython(v.tensor, false));
          } else {
            column.append(py::make_tuple(TensorCapsule(owner, v.tensor), std::string(stoker::ElementTypeName(type)),
                                         std::string(stoker::ElementTypeName(type))));
          }
          break;
        }
        case stoker::FieldKind::kText:
        case stoker::FieldKind::kJson:
          column.append(py::str(v.bytes.data(), v.bytes.size()));  // checked UTF-8
          break;
        case stoker::FieldKind::kBytes:
          column.append(py::bytes(v.bytes.data(), v.bytes.size()));
          break;
      }
    }
    out.append(std::move(column));
  }
  return out;
}

void BindFields(py::module_& m) {
  py::enum_<stoker::FieldKind>(m, "FieldKind")
      .value("image", stoker::FieldKind::kImage)
      .value("int", stoker::FieldKind::kInt)
      .value("float", stoker::FieldKind::kFloat)
      .value("array", stoker::FieldKind::kArray)
      .value("text", stoker::FieldKind::kText)
      .value("json", stoker::FieldKind::kJson)
      .value("bytes", stoker::FieldKind::kBytes)
      .value("custom", stoker::FieldKind::kCustom)
      .value("boxes", stoker::FieldKind::kBoxes)
      .value("keypoints", stoker::FieldKind::kKeypoints)
      .value("mask", stoker::FieldKind::kMask);
  py::class_<stoker::FieldSpec>(m, "FieldSpec")
      .def(py::init<>())
      .def_readwrite("name", &stoker::FieldSpec::name)
      .def_readwrite("kind", &stoker::FieldSpec::kind)
      .def_readwrite("keys", &stoker::FieldSpec::keys)
      .def_readwrite("optional", &stoker::FieldSpec::optional)
      .def_readwrite("mode", &stoker::FieldSpec::mode)
      .def_readwrite("transformed", &stoker::FieldSpec::transformed)
      .def_readwrite("decoder", &stoker::FieldSpec::decoder)
      .def_readwrite("follows", &stoker::FieldSpec::follows)
      .def_readwrite("box_format", &stoker::FieldSpec::box_format)
      .def_readwrite("labels", &stoker::FieldSpec::labels)
      .def_readwrite("fill", &stoker::FieldSpec::fill)
      .def_readwrite("mask_mode", &stoker::FieldSpec::mask_mode)
      .def_readwrite("array_transform", &stoker::FieldSpec::array_transform)
      .def_readwrite("array_layout", &stoker::FieldSpec::array_layout);
  m.def("load_field_extension", [](const std::string& path) { Check(stoker::LoadFieldExtension(path)); });
  m.def("field_extension_decoders", [] { return stoker::FieldExtensionDecoders(); });
}

void BindDecoders(py::module_& m) {
  // `f` of a buffer's bytes (bytes, bytearray, memoryview), read in place.
  const auto with_bytes = [](auto f) {
    return [f](const py::buffer& data) {
      const py::buffer_info info = data.request();
      return f(std::span<const std::byte>(static_cast<const std::byte*>(info.ptr),
                                          static_cast<std::size_t>(info.size * info.itemsize)));
    };
  };
  // None, or why `data` fails the header check pack and DatasetWriter make of image fields.
  m.def("image_header_problem", with_bytes([](std::span<const std::byte> bytes) -> std::optional<std::string> {
          const stoker::Status s = stoker::CheckImageHeader(bytes);
          if (s.ok()) return std::nullopt;
          return s.message();
        }),
        py::arg("data"));
  // The extension an image field of these bytes takes ("jpg", "bmp", ...), or None for no format stoker decodes.
  m.def("image_field_extension", with_bytes([](std::span<const std::byte> bytes) -> std::optional<std::string> {
          const std::string_view ext = stoker::ImageFieldExtension(bytes);
          if (ext.empty()) return std::nullopt;
          return std::string(ext);
        }),
        py::arg("data"));
  m.def(
      "decode_image",
      [](py::bytes data, const std::string& mode, std::uint64_t max_pixels, bool torch_has_unsigned) {
        std::string_view view;
        const auto bytes = BytesOf(data, &view);
        stoker::Result<stoker::HostTensor> t = [&] {
          py::gil_scoped_release release;
          return stoker::DecodeImage(bytes, mode, max_pixels);
        }();
        return ToPython(Unwrap(std::move(t)), torch_has_unsigned);
      },
      py::arg("data"), py::arg("mode") = "RGB", py::arg("max_pixels") = stoker::kDefaultMaxImagePixels,
      py::arg("torch_has_unsigned") = false);
  m.def(
      "decode_npy",
      [](py::bytes data, bool torch_has_unsigned) {
        std::string_view view;
        const auto bytes = BytesOf(data, &view);
        stoker::Result<stoker::HostTensor> t = [&] {
          py::gil_scoped_release release;
          return stoker::DecodeNpy(bytes);
        }();
        return ToPython(Unwrap(std::move(t)), torch_has_unsigned);
      },
      py::arg("data"), py::arg("torch_has_unsigned") = false);
  m.def(
      "decode_array",
      [](py::bytes data, std::uint64_t max_pixels, bool torch_has_unsigned) {
        std::string_view view;
        const auto bytes = BytesOf(data, &view);
        stoker::Result<stoker::HostTensor> t = [&] {
          py::gil_scoped_release release;
          return stoker::DecodeArray(bytes, max_pixels);
        }();
        return ToPython(Unwrap(std::move(t)), torch_has_unsigned);
      },
      py::arg("data"), py::arg("max_pixels") = stoker::kDefaultMaxImagePixels, py::arg("torch_has_unsigned") = false);
}

}  // namespace stoker_python
