// A torch training state (nested dicts, lists and tuples of tensors and
// plain values) flattened for Checkpointer::Save in one native pass: the
// tensors as TensorRefs with stable names ("model.layer1.weight",
// "optimizer.state.0.exp_avg"), and the JSON structure that rebuilds the
// state on load (docs/checkpoint.md, "The Python state structure").
//
// Why native: a state holds tens of thousands of tensors, and the training
// loop waits for this pass. Done in Python it cost about 10 us a tensor
// (recursion, name formatting, a detach() and a dict per tensor); here it is
// a few attribute reads per tensor, no Python objects made.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <span>
#include <string>
#include <vector>

#include "stoker/checkpoint.h"

namespace stoker_python {

namespace py = pybind11;

// torch's types, passed in by the Python package (the bindings do not link
// torch).
struct TorchTypes {
  py::object tensor;         // torch.Tensor
  py::object strided;        // torch.strided
  py::object ordered_dict;   // collections.OrderedDict
  py::dict dtype_names;      // torch dtype -> safetensors name ("F32", ...)
  bool cuda_usable = false;  // stoker can copy from GPU memory itself
  // Sharded saves (may be None): stoker.Shard, whose instances are saved as
  // pieces of a global tensor; and the types (DTensor, ShardedTensor) that
  // `convert` turns into a Shard, a list of Shards or a plain tensor.
  py::object shard_type;
  py::object convert_types;
  py::object convert;
  // Called (may be None) with a value that is none of the above and no
  // plain value: returns None to refuse it, or (tag, attributes as JSON text
  // or None, what to save in its place), recorded as {"x": tag, "a": ...,
  // "n": node} for load to rebuild (NumPy arrays, argparse.Namespace, ...).
  py::object other;
};

// Reused from save to save (Checkpointer keeps one): the names' and
// shapes' storage, the vectors and the structure's text keep their capacity,
// so that a steady-state flatten allocates nothing per tensor and frees
// nothing on the training thread.
class FlatState {
 public:
  // This save's tensors, borrowed from `keep_alive`.
  [[nodiscard]] std::span<const stoker::TensorRef> tensors() const { return {tensors_.data(), count_}; }
  [[nodiscard]] const std::string& structure() const { return structure_; }   // JSON
  [[nodiscard]] const std::vector<int>& devices() const { return devices_; }  // CUDA devices used, ascending
  // Dict entries holding code (a method, function or weak method, such as
  // the `anneal_func` torch 1.13's OneCycleLR puts in its state_dict): the
  // structure records each as {"c": qualified name}, and loading leaves the
  // entry out, so load_state_dict() keeps the new object's own.
  [[nodiscard]] const std::vector<std::string>& code_entries() const { return code_entries_; }
  // A hash of every tensor's name, dtype, shape, global shape and offsets:
  // equal on two saves when the sharded layout is the same.
  [[nodiscard]] std::uint64_t LayoutDigest() const;

  // Refills from `state`. Raises TypeError for what cannot be checkpointed,
  // naming the entry's path; two entries whose names collide ({"a.b": x,
  // "a": {"b": y}}) are refused by Checkpointer::Save (one sort there finds
  // them).
  void Flatten(py::handle state, const TorchTypes& torch);
  // Appends one raw tensor (tests and tools: no structure then).
  void AddRaw(stoker::TensorRef ref) { NextRef() = std::move(ref); }
  // Drops the references to the tensors (and copies made of them), once
  // their snapshot is taken, and with them the borrowed refs; keeps the
  // storage for the next save.
  void Release() {
    keep_alive_.clear();
    count_ = 0;
  }

 private:
  friend class Flattener;
  stoker::TensorRef& NextRef() {
    if (count_ == tensors_.size()) tensors_.emplace_back();
    return tensors_[count_++];
  }

  std::vector<stoker::TensorRef> tensors_;  // the first count_ are this save's
  std::size_t count_ = 0;
  std::vector<py::object> keep_alive_;  // every tensor, and copies made (.contiguous(), .cpu())
  std::string structure_;
  std::vector<int> devices_;
  std::vector<std::string> code_entries_;
};

void BindStateFlatten(py::module_& m);

}  // namespace stoker_python
