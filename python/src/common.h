// Shared by the binding files: Status -> Python exception, and DLPack
// capsules whose deleter drops a reference to whatever owns the memory.
#pragma once

#include <dlpack/dlpack.h>
#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "stoker/loader.h"
#include "stoker/status.h"

namespace stoker_python {

namespace py = pybind11;

// Called once by the Python package at import with its exception classes.
void SetExceptions(py::object stoker_error, py::object corruption_error);

// Raises the Python exception for `status` (ValueError, FileNotFoundError,
// OSError, stoker.CorruptionError, stoker.StokerError, ...).
[[noreturn]] void Raise(const stoker::Status& status);

template <typename T>
T Unwrap(stoker::Result<T> result) {
  if (!result.ok()) Raise(result.error());
  return std::move(result).value();
}

inline void Check(const stoker::Status& status) {
  if (!status.ok()) Raise(status);
}

// A "dltensor" capsule over `data` (CPU, compact row-major) that keeps
// `owner` alive until the consumer (torch) frees the tensor.
py::capsule MakeCapsule(std::shared_ptr<void> owner, void* data, int ndim, std::array<std::int64_t, 4> shape,
                        DLDataType dtype, DLDevice device = {kDLCPU, 0});
py::capsule MakeCapsule(std::shared_ptr<void> owner, void* data, std::vector<std::int64_t> shape, DLDataType dtype,
                        DLDevice device = {kDLCPU, 0});

// LoaderState <-> the dict stoker.Loader.state_dict() returns.
py::dict LoaderStateToDict(const stoker::LoaderState& state);
stoker::LoaderState LoaderStateFromDict(const py::dict& d);

void BindCheckpoint(py::module_& m);
void BindOrderTools(py::module_& m);
void BindPack(py::module_& m);  // stoker.pack, stoker.DatasetWriter
void BindDecoders(py::module_& m);
void BindFields(py::module_& m);
void BindTokens(py::module_& m);
void BindAugment(py::module_& m);
// A batch's typed fields, one list per spec (None without fields): per
// sample a capsule tuple (tensor kinds; `owner` keeps the batch alive), an
// int or float, a str (text, JSON), bytes, or None where absent.
py::object FieldsToPython(stoker::Batch& batch, const std::shared_ptr<void>& owner);

}  // namespace stoker_python
