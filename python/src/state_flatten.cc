#include "state_flatten.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string_view>
#include <utility>

namespace stoker_python {
namespace {

// Deeper than any real state; stops a list that contains itself.
constexpr int kMaxDepth = 1000;

// Attribute and method names, made once.
struct Names {
  py::str layout{"layout"}, is_cuda{"is_cuda"}, is_cpu{"is_cpu"}, get_device{"get_device"}, cpu{"cpu"},
      is_contiguous{"is_contiguous"}, contiguous{"contiguous"}, dtype{"dtype"}, shape{"shape"}, data_ptr{"data_ptr"},
      is_conj{"is_conj"}, resolve_conj{"resolve_conj"}, items{"items"}, hex{"hex"}, tensor{"tensor"},
      global_shape{"global_shape"}, offsets{"offsets"};
};

const Names& N() {
  static const Names* names = new Names();  // never destroyed: Python may be gone at exit
  return *names;
}

py::object Steal(PyObject* p) {
  if (p == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(p);
}
py::object Attr(py::handle o, const py::str& name) {
  return Steal(PyObject_GetAttr(o.ptr(), name.ptr()));
}
py::object Call(py::handle o, const py::str& method) {
  return Steal(PyObject_CallMethodNoArgs(o.ptr(), method.ptr()));
}
bool Truth(const py::object& o) {
  const int v = PyObject_IsTrue(o.ptr());
  if (v < 0) throw py::error_already_set();
  return v == 1;
}

std::string_view Utf8(py::handle str) {
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(str.ptr(), &size);
  if (data == nullptr) throw py::error_already_set();
  return {data, static_cast<std::size_t>(size)};
}

// JSON string: UTF-8 as is, quotes, backslashes and control characters
// escaped; runs without any appended whole.
void AppendJsonString(std::string& out, std::string_view s) {
  out += '"';
  std::size_t run = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c != '"' && c != '\\' && c >= 0x20) continue;
    out.append(s.data() + run, i - run);
    run = i + 1;
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    }
  }
  out.append(s.data() + run, s.size() - run);
  out += '"';
}

// An int's decimal digits, as int.__repr__ writes them (an IntEnum's str()
// would give its name).
std::string Digits(py::handle integer) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(integer.ptr(), &overflow);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (overflow == 0) return std::to_string(v);
  return std::string(Utf8(Steal(PyLong_Type.tp_repr(integer.ptr()))));
}

std::string Repr(py::handle o) {
  return std::string(Utf8(Steal(PyObject_Repr(o.ptr()))));
}
std::string ReprPath(const std::string& path) {
  return Repr(py::str(path.empty() ? std::string("<root>") : path));
}

}  // namespace

class Flattener {
 public:
  Flattener(const TorchTypes& torch, FlatState& out) : torch_(torch), out_(out) {
    for (auto [dtype, name] : torch.dtype_names) {
      if (auto parsed = stoker::ParseTensorDType(Utf8(name))) dtypes_.emplace_back(dtype.ptr(), *parsed);
    }
  }

  // Appends `obj`'s node to the structure; `path` is its name, restored on return.
  void Node(py::handle obj, std::string& path, int depth) {
    if (depth > kMaxDepth)
      throw py::value_error("the state nests deeper than " + std::to_string(kMaxDepth) + " levels at " +
                            ReprPath(path) + " (does a list or dict contain itself?)");
    std::string& json = out_.structure_;
    if (IsInstance(obj, torch_.convert_types)) {
      // DTensor, ShardedTensor: what they hold here, as Shards or a tensor.
      const py::object converted = torch_.convert(obj);
      const std::string name = path.empty() ? std::string("tensor") : path;
      if (IsInstance(converted, torch_.shard_type) || PyList_Check(converted.ptr())) {
        json += "{\"t\":";
        AppendJsonString(json, name);
        json += ",\"s\":true}";
        if (PyList_Check(converted.ptr())) {
          for (py::handle shard : converted) ShardPiece(shard, name);
        } else {
          ShardPiece(converted, name);
        }
        return;
      }
      Node(converted, path, depth + 1);
      return;
    }
    if (IsInstance(obj, torch_.shard_type)) {
      const std::string name = path.empty() ? std::string("tensor") : path;
      json += "{\"t\":";
      AppendJsonString(json, name);
      json += ",\"s\":true}";
      ShardPiece(obj, name);
      return;
    }
    if (IsTensor(obj)) {
      static const std::string kRootName = "tensor";  // a bare tensor as the whole state
      const std::string& name = path.empty() ? kRootName : path;
      json += "{\"t\":";
      AppendJsonString(json, name);
      json += '}';
      Tensor(obj, name);
    } else if (PyDict_Check(obj.ptr())) {
      Dict(obj, path, depth);
    } else if (PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr())) {
      const bool is_list = PyList_Check(obj.ptr());
      json += is_list ? "{\"l\":[" : "{\"u\":[";
      const Py_ssize_t n = is_list ? PyList_GET_SIZE(obj.ptr()) : PyTuple_GET_SIZE(obj.ptr());
      for (Py_ssize_t i = 0; i < n; ++i) {
        if (i > 0) json += ',';
        const std::size_t mark = path.size();
        if (!path.empty()) path += '.';
        path += std::to_string(i);
        // Borrowed: the container holds its items while we walk it.
        Node(is_list ? PyList_GET_ITEM(obj.ptr(), i) : PyTuple_GET_ITEM(obj.ptr(), i), path, depth + 1);
        path.resize(mark);
      }
      json += "]}";
    } else if (obj.is_none()) {
      json += "{\"v\":null}";
    } else if (PyBool_Check(obj.ptr())) {
      json += obj.ptr() == Py_True ? "{\"v\":true}" : "{\"v\":false}";
    } else if (PyLong_Check(obj.ptr())) {
      json += "{\"v\":" + Digits(obj) + "}";
    } else if (PyUnicode_Check(obj.ptr())) {
      json += "{\"v\":";
      AppendJsonString(json, Utf8(obj));
      json += '}';
    } else if (PyFloat_Check(obj.ptr())) {
      // Hex is exact, and NaN and infinities survive JSON.
      json += "{\"f\":";
      AppendJsonString(
          json,
          Utf8(Steal(PyObject_CallMethodOneArg(reinterpret_cast<PyObject*>(&PyFloat_Type), N().hex.ptr(), obj.ptr()))));
      json += '}';
    } else if (!Other(obj, path, depth)) {
      throw py::type_error("cannot checkpoint " + Repr(py::str(Py_TYPE(obj.ptr())->tp_name)) + " at " + ReprPath(path) +
                           ": only tensors, dicts, lists, tuples, numbers, strings, None, NumPy arrays and "
                           "numbers, bytes, argparse.Namespace, paths, and torch dtypes and devices");
    }
  }

 private:
  // Code, not state: a bound method, a function (Python or built-in), or a
  // weak reference to a method (weakref.WeakMethod, which CyclicLR keeps).
  static bool IsCode(py::handle obj) {
    PyObject* o = obj.ptr();
    if (PyMethod_Check(o) || PyFunction_Check(o) || PyCFunction_Check(o)) return true;
    if (!PyWeakref_Check(o)) return false;
    if (std::string_view(Py_TYPE(o)->tp_name) == "WeakMethod") return true;
    PyObject* target = PyWeakref_GetObject(o);  // borrowed; None when dead
    return target != nullptr && PyFunction_Check(target);
  }

  // What the structure records of code: its qualified name (no address, so
  // equal states give equal structures), else its type's name.
  static std::string CodeName(py::handle obj) {
    PyObject* name = PyObject_GetAttrString(obj.ptr(), "__qualname__");
    if (name != nullptr && PyUnicode_Check(name)) return std::string(Utf8(Steal(name)));
    Py_XDECREF(name);
    PyErr_Clear();
    return Py_TYPE(obj.ptr())->tp_name;
  }

  // A value TorchTypes::other saves in another form; false when it refuses it.
  bool Other(py::handle obj, std::string& path, int depth) {
    if (!torch_.other || torch_.other.is_none()) return false;
    const py::object converted = torch_.other(obj);
    if (converted.is_none()) return false;
    const auto parts = converted.cast<py::tuple>();
    std::string& json = out_.structure_;
    json += "{\"x\":";
    AppendJsonString(json, Utf8(parts[0]));
    if (!parts[1].is_none()) {
      json += ",\"a\":";
      json += Utf8(parts[1]);  // JSON made by the converter
    }
    json += ",\"n\":";
    Node(parts[2], path, depth + 1);
    json += '}';
    return true;
  }

  static bool IsInstance(py::handle obj, const py::object& types) {
    if (!types || types.is_none()) return false;
    const int is = PyObject_IsInstance(obj.ptr(), types.ptr());
    if (is < 0) throw py::error_already_set();
    return is == 1;
  }

  // A stoker.Shard: its local tensor, saved as the piece at `offsets` of a
  // tensor of `global_shape` (checked by the checkpointer).
  void ShardPiece(py::handle shard, const std::string& name) {
    if (!IsInstance(shard, torch_.shard_type))
      throw py::type_error("a sharded tensor at " + ReprPath(name) + " converted to " +
                           Repr(py::str(Py_TYPE(shard.ptr())->tp_name)) + ", not a stoker.Shard");
    const std::size_t before = out_.count_;
    Tensor(Attr(shard, N().tensor), name);
    if (out_.count_ == before) return;
    stoker::TensorRef& ref = out_.tensors_[out_.count_ - 1];
    ref.global_shape = Attr(shard, N().global_shape).cast<std::vector<std::uint64_t>>();
    ref.global_offsets = Attr(shard, N().offsets).cast<std::vector<std::uint64_t>>();
  }

  bool IsTensor(py::handle obj) const {
    if (Py_TYPE(obj.ptr()) == reinterpret_cast<PyTypeObject*>(torch_.tensor.ptr())) return true;
    if (PyDict_Check(obj.ptr()) || PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr()) || PyUnicode_Check(obj.ptr()) ||
        PyLong_Check(obj.ptr()) || PyFloat_Check(obj.ptr()) || obj.is_none())
      return false;
    const int is = PyObject_IsInstance(obj.ptr(), torch_.tensor.ptr());  // nn.Parameter and other subclasses
    if (is < 0) throw py::error_already_set();
    return is == 1;
  }

  void Dict(py::handle obj, std::string& path, int depth) {
    bool ordered = false;
    if (!PyDict_CheckExact(obj.ptr())) {
      const int is = PyObject_IsInstance(obj.ptr(), torch_.ordered_dict.ptr());
      if (is < 0) throw py::error_already_set();
      ordered = is == 1;
    }
    std::string& json = out_.structure_;
    json += "{\"d\":[";
    bool first = true;
    auto entry = [&](py::handle key, py::handle value) {
      if (PyBool_Check(key.ptr()) || !(PyUnicode_Check(key.ptr()) || PyLong_Check(key.ptr())))
        throw py::type_error("state key " + Repr(key) + " at " + ReprPath(path) + " is not a str or int");
      if (!first) json += ',';
      first = false;
      json += '[';
      const std::size_t mark = path.size();
      if (!path.empty()) path += '.';
      if (PyUnicode_Check(key.ptr())) {
        const std::string_view text = Utf8(key);
        AppendJsonString(json, text);
        path += text;
      } else {
        const std::string digits = Digits(key);
        json += digits;
        path += digits;
      }
      json += ',';
      if (IsCode(value)) {
        json += "{\"c\":";
        AppendJsonString(json, CodeName(value));
        json += '}';
        out_.code_entries_.push_back(path);
      } else {
        Node(value, path, depth + 1);
      }
      json += ']';
      path.resize(mark);
    };
    if (PyDict_CheckExact(obj.ptr())) {
      PyObject *key = nullptr, *value = nullptr;
      Py_ssize_t pos = 0;
      while (PyDict_Next(obj.ptr(), &pos, &key, &value)) entry(key, value);
    } else {
      // A subclass (OrderedDict) keeps its own order: ask it.
      for (py::handle item : Call(obj, N().items)) {
        auto pair = py::reinterpret_borrow<py::tuple>(item);
        entry(pair[0], pair[1]);
      }
    }
    json += ordered ? "],\"o\":true}" : "],\"o\":false}";
  }

  void Tensor(py::handle obj, const std::string& name) {
    try {
      ReadTensor(obj, name);
    } catch (py::error_already_set& e) {
      // torch's own error (a meta tensor has no data, ...), or ours: the
      // same exception type, saying which tensor.
      if (!e.matches(PyExc_Exception)) throw;
      const std::string message = py::str(e.value()).cast<std::string>();
      if (message.starts_with("tensor " + Repr(py::str(name)))) throw;
      PyErr_SetString(e.type().ptr(), ("tensor " + Repr(py::str(name)) + ": " + message).c_str());
      throw py::error_already_set();
    }
  }

  void ReadTensor(py::handle obj, const std::string& name) {
    const Names& n = N();
    py::object t = py::reinterpret_borrow<py::object>(obj);
    // Five attribute reads a tensor in the common case (on the CPU,
    // contiguous): each costs about 0.1 us over tens of thousands of tensors.
    int device = -1;
    if (!Truth(Attr(t, n.is_cpu))) {
      if (Truth(Attr(t, n.is_cuda)) && torch_.cuda_usable) {
        device = Call(t, n.get_device).cast<int>();
      } else {
        // Meta, mps, xla, ... or a GPU stoker cannot reach: torch copies to the host.
        t = Call(t, n.cpu);
      }
    }
    try {
      if (!Truth(Call(t, n.is_contiguous))) t = Call(t, n.contiguous);
    } catch (py::error_already_set&) {
      RefuseLayout(t, name);
      throw;
    }
    const py::object dtype = Attr(t, n.dtype);
    const auto found =
        std::find_if(dtypes_.begin(), dtypes_.end(), [&](const auto& e) { return e.first == dtype.ptr(); });
    if (found == dtypes_.end())
      throw py::type_error("tensor " + Repr(py::str(name)) + " has dtype " + py::str(dtype).cast<std::string>() +
                           ", which safetensors cannot store");
    // A lazily conjugated complex view: its memory holds the unconjugated values.
    if (found->second == stoker::TensorDType::kComplex64 && Truth(Call(t, n.is_conj))) t = Call(t, n.resolve_conj);
    const py::object shape = Attr(t, n.shape);
    const Py_ssize_t ndim = PyTuple_Size(shape.ptr());
    if (ndim < 0) throw py::error_already_set();
    const void* data = nullptr;
    try {
      data = reinterpret_cast<const void*>(Call(t, n.data_ptr).cast<std::uintptr_t>());
    } catch (py::error_already_set&) {
      RefuseLayout(t, name);  // a sparse COO tensor says it is contiguous, then has no data pointer
      throw;
    }
    // Assigned into the reused entry: its string and vector keep their capacity.
    stoker::TensorRef& ref = out_.NextRef();
    ref.name.assign(name);
    ref.dtype = found->second;
    ref.shape.resize(static_cast<std::size_t>(ndim));
    for (Py_ssize_t d = 0; d < ndim; ++d) {
      ref.shape[d] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(shape.ptr(), d));
      if (PyErr_Occurred()) {
        --out_.count_;
        throw py::error_already_set();
      }
    }
    ref.data = data;
    ref.device = device;
    ref.global_shape.clear();  // (a reused entry may have held a shard)
    ref.global_offsets.clear();
    if (device >= 0 && std::find(out_.devices_.begin(), out_.devices_.end(), device) == out_.devices_.end())
      out_.devices_.push_back(device);
    out_.keep_alive_.push_back(std::move(t));
  }

  // After a tensor's call failed (the error is held by the caught
  // error_already_set): a clearer error for a tensor that is not dense;
  // otherwise the caller re-raises torch's.
  void RefuseLayout(py::handle t, const std::string& name) const {
    PyObject* l = PyObject_GetAttr(t.ptr(), N().layout.ptr());
    if (l == nullptr) PyErr_Clear();
    const auto layout = py::reinterpret_steal<py::object>(l);
    if (layout && !layout.is(torch_.strided))
      throw py::type_error("tensor " + Repr(py::str(name)) + " has layout " + py::str(layout).cast<std::string>() +
                           ": only dense (strided) tensors can be checkpointed; save its dense form or its parts");
  }

  const TorchTypes& torch_;
  FlatState& out_;
  std::vector<std::pair<PyObject*, stoker::TensorDType>> dtypes_;  // dtype objects are singletons
};

void FlatState::Flatten(py::handle state, const TorchTypes& torch) {
  count_ = 0;
  keep_alive_.clear();
  structure_.clear();
  devices_.clear();
  code_entries_.clear();
  Flattener flattener(torch, *this);
  std::string path;
  try {
    flattener.Node(state, path, 0);
  } catch (...) {
    count_ = 0;
    keep_alive_.clear();
    structure_.clear();
    throw;
  }
  std::sort(devices_.begin(), devices_.end());
}

std::uint64_t FlatState::LayoutDigest() const {
  std::string text;
  for (const auto& t : tensors()) {
    text += t.name;
    text += '\0';
    text += std::to_string(static_cast<int>(t.dtype));
    for (const auto* dims : {&t.shape, &t.global_shape, &t.global_offsets}) {
      text += '|';
      for (auto d : *dims) text += std::to_string(d) + ",";
    }
    text += '\n';
  }
  // Compared only between ranks of one job, which run one build.
  return std::hash<std::string>{}(text);
}

void BindStateFlatten(py::module_& m) {
  py::class_<FlatState>(m, "FlatState")
      .def(py::init<>())
      // Raw tensors, [(name, safetensors dtype, shape, data pointer, device)],
      // borrowed (the caller keeps the memory alive) and with no structure:
      // they load back as a flat {name: tensor}. For tests and tools.
      .def(py::init([](const py::list& tensors) {
        FlatState flat;
        for (const auto& item : tensors) {
          const auto t = item.cast<py::tuple>();
          stoker::TensorRef ref;
          ref.name = t[0].cast<std::string>();
          const auto dtype = stoker::ParseTensorDType(t[1].cast<std::string>());
          if (!dtype) throw py::value_error("unsupported safetensors dtype '" + t[1].cast<std::string>() + "'");
          ref.dtype = *dtype;
          ref.shape = t[2].cast<std::vector<std::uint64_t>>();
          ref.data = reinterpret_cast<const void*>(t[3].cast<std::uintptr_t>());
          ref.device = t[4].cast<int>();
          flat.AddRaw(std::move(ref));
        }
        return flat;
      }))
      .def(
          "flatten",
          [](FlatState& flat, py::handle state, py::object tensor, py::object strided, py::object ordered_dict,
             py::dict dtype_names, bool cuda_usable, py::object shard_type, py::object convert_types,
             py::object convert, py::object other) {
            const TorchTypes torch{std::move(tensor),        std::move(strided), std::move(ordered_dict),
                                   std::move(dtype_names),   cuda_usable,        std::move(shard_type),
                                   std::move(convert_types), std::move(convert), std::move(other)};
            flat.Flatten(state, torch);
          },
          py::arg("state"), py::arg("tensor_type"), py::arg("strided"), py::arg("ordered_dict"), py::arg("dtype_names"),
          py::arg("cuda_usable"), py::arg("shard_type") = py::none(), py::arg("convert_types") = py::none(),
          py::arg("convert") = py::none(), py::arg("other") = py::none())
      .def_property_readonly("layout_digest", &FlatState::LayoutDigest)
      // [(name, safetensors dtype, shape, global shape, offsets)]: what
      // ranks exchange to agree on who writes which piece. A whole tensor's
      // global shape is its shape and its offsets are zeros.
      .def("layout",
           [](const FlatState& f) {
             py::list out;
             for (const auto& t : f.tensors()) {
               const bool whole = t.global_shape.empty();
               out.append(py::make_tuple(
                   t.name, std::string(stoker::TensorDTypeName(t.dtype)), py::tuple(py::cast(t.shape)),
                   py::tuple(py::cast(whole ? t.shape : t.global_shape)),
                   py::tuple(py::cast(whole ? std::vector<std::uint64_t>(t.shape.size(), 0) : t.global_offsets))));
             }
             return out;
           })
      .def("release", &FlatState::Release)
      .def_property_readonly("devices", &FlatState::devices)
      .def_property_readonly("tensor_count", [](const FlatState& f) { return f.tensors().size(); })
      .def_property_readonly("names",
                             [](const FlatState& f) {
                               py::list names;
                               for (const auto& t : f.tensors()) names.append(py::str(t.name));
                               return names;
                             })
      .def_property_readonly("structure", &FlatState::structure)
      .def_property_readonly("code_entries", &FlatState::code_entries);
}

}  // namespace stoker_python
