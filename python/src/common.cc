#include "common.h"

#include <algorithm>
#include <string>
#include <vector>

namespace stoker_python {
namespace {

// Set by the Python package at import: its exception classes.
py::object g_corruption_error;
py::object g_stoker_error;

struct TensorContext {
  std::shared_ptr<void> owner;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  DLManagedTensor managed{};
};

void DeleteManaged(DLManagedTensor* managed) {
  // Owned through manager_ctx since MakeCapsule released it; DLPack's C
  // protocol leaves no other way to hand ownership across.
  std::unique_ptr<TensorContext>(static_cast<TensorContext*>(managed->manager_ctx));
}

void DeleteCapsule(PyObject* capsule) {
  // Torch renames a consumed capsule "used_dltensor" and owns it from then on.
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
  }
}

}  // namespace

void SetExceptions(py::object stoker_error, py::object corruption_error) {
  g_stoker_error = std::move(stoker_error);
  g_corruption_error = std::move(corruption_error);
}

void Raise(const stoker::Status& status) {
  const std::string& message = status.message();
  switch (status.code()) {
    case stoker::StatusCode::kInvalidArgument:
      throw py::value_error(message);
    case stoker::StatusCode::kNotFound:
      PyErr_SetString(PyExc_FileNotFoundError, message.c_str());
      break;
    case stoker::StatusCode::kAlreadyExists:
      PyErr_SetString(PyExc_FileExistsError, message.c_str());
      break;
    case stoker::StatusCode::kIOError:
    case stoker::StatusCode::kResourceExhausted:
      PyErr_SetString(PyExc_OSError, message.c_str());
      break;
    case stoker::StatusCode::kCorruption:
      PyErr_SetString(g_corruption_error ? g_corruption_error.ptr() : PyExc_RuntimeError, message.c_str());
      break;
    default:
      PyErr_SetString(g_stoker_error ? g_stoker_error.ptr() : PyExc_RuntimeError, status.ToString().c_str());
      break;
  }
  throw py::error_already_set();
}

py::dict LoaderStateToDict(const stoker::LoaderState& s) {
  py::dict d;
  d["seed"] = s.seed;
  d["epoch"] = s.epoch;
  d["global_batch_size"] = s.global_batch_size;
  d["batches_consumed"] = s.batches_consumed;
  d["num_samples"] = s.num_samples;
  return d;
}

stoker::LoaderState LoaderStateFromDict(const py::dict& d) {
  stoker::LoaderState s;
  s.seed = d["seed"].cast<std::uint64_t>();
  s.epoch = d["epoch"].cast<std::uint64_t>();
  s.global_batch_size = d["global_batch_size"].cast<std::uint64_t>();
  s.batches_consumed = d["batches_consumed"].cast<std::uint64_t>();
  s.num_samples = d["num_samples"].cast<std::uint64_t>();
  return s;
}

py::capsule MakeCapsule(std::shared_ptr<void> owner, void* data, int ndim, std::array<std::int64_t, 4> shape,
                        DLDataType dtype, DLDevice device) {
  return MakeCapsule(std::move(owner), data, std::vector<std::int64_t>(shape.begin(), shape.begin() + ndim), dtype,
                     device);
}

py::capsule MakeCapsule(std::shared_ptr<void> owner, void* data, std::vector<std::int64_t> shape, DLDataType dtype,
                        DLDevice device) {
  auto ctx = std::make_unique<TensorContext>();
  ctx->owner = std::move(owner);
  ctx->shape = std::move(shape);
  DLTensor& t = ctx->managed.dl_tensor;
  t.data = data;
  t.device = device;
  t.ndim = static_cast<int>(ctx->shape.size());
  t.dtype = dtype;
  t.shape = ctx->shape.data();
  // Compact row-major, spelled out: torch 1.13 takes a null `strides`
  // through a slow path when a dimension has size 1 (0.7 s for a
  // [430, 495, 1] mask, 1 ms with strides given).
  ctx->strides.assign(ctx->shape.size(), 1);
  for (std::size_t d = ctx->shape.size(); d-- > 1;)
    ctx->strides[d - 1] = ctx->strides[d] * std::max<std::int64_t>(ctx->shape[d], 1);
  t.strides = ctx->strides.data();
  t.byte_offset = 0;
  ctx->managed.manager_ctx = ctx.get();
  ctx->managed.deleter = DeleteManaged;
  DLManagedTensor* managed = &ctx.release()->managed;
  return py::capsule(managed, "dltensor", DeleteCapsule);
}

}  // namespace stoker_python
