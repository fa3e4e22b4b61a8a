// Bindings for stoker::Checkpointer and the checkpoint readers. The Python
// package (stoker/checkpoint.py) flattens torch state dicts into the flat
// (name, dtype, shape, pointer) list taken here and rebuilds them on load.
#include <pybind11/stl.h>

#include "common.h"
#include "stoker/checkpoint.h"

namespace stoker_python {
namespace {

std::optional<stoker::LoaderState> LoaderStateFrom(const py::object& o) {
  if (o.is_none()) return std::nullopt;
  return LoaderStateFromDict(o.cast<py::dict>());
}

py::object LoaderStateTo(const std::optional<stoker::LoaderState>& s) {
  if (!s) return py::none();
  return LoaderStateToDict(*s);
}

stoker::TensorDType DTypeFrom(const std::string& name) {
  auto dtype = stoker::ParseTensorDType(name);
  if (!dtype) throw py::value_error("unsupported safetensors dtype '" + name + "'");
  return *dtype;
}

class PyCheckpointer {
 public:
  explicit PyCheckpointer(stoker::CheckpointOptions options)
      : checkpointer_(Unwrap(stoker::Checkpointer::Open(std::move(options)))) {}

  // tensors: [(name, dtype, shape, data_ptr, device)]; returns True when
  // started, False when skipped because a persist was in flight.
  bool Save(std::int64_t step, const py::list& tensors, const py::object& loader_state,
            const std::map<std::string, std::string>& rng_states, const std::map<std::string, std::string>& metadata,
            std::optional<double> metric, const std::string& user_json) {
    std::vector<stoker::TensorRef> refs;
    refs.reserve(tensors.size());
    for (const auto& item : tensors) {
      const auto t = item.cast<py::tuple>();
      stoker::TensorRef ref;
      ref.name = t[0].cast<std::string>();
      ref.dtype = DTypeFrom(t[1].cast<std::string>());
      ref.shape = t[2].cast<std::vector<std::uint64_t>>();
      ref.data = reinterpret_cast<const void*>(t[3].cast<std::uintptr_t>());
      ref.device = t[4].cast<int>();
      refs.push_back(std::move(ref));
    }
    stoker::CheckpointExtras extras;
    extras.loader_state = LoaderStateFrom(loader_state);
    extras.rng_states = rng_states;
    extras.metadata = metadata;
    extras.metric = metric;
    extras.user_json = user_json;
    stoker::Result<stoker::SaveOutcome> outcome = stoker::Status::Internal("unset");
    {
      // The caller's list keeps the tensors alive; training threads that do
      // not touch them may run while we copy.
      py::gil_scoped_release release;
      outcome = checkpointer_->Save(step, refs, extras);
    }
    return Unwrap(std::move(outcome)) == stoker::SaveOutcome::kStarted;
  }

  void Wait() {
    stoker::Status s;
    {
      py::gil_scoped_release release;
      s = checkpointer_->Wait();
    }
    Check(s);
  }

  bool Due(std::int64_t step) const { return checkpointer_->Due(step); }

  py::dict Stats() const {
    const auto s = checkpointer_->stats();
    py::dict d;
    d["saves_started"] = s.saves_started;
    d["saves_published"] = s.saves_published;
    d["saves_failed"] = s.saves_failed;
    d["skipped_busy"] = s.skipped_busy;
    d["waited_busy"] = s.waited_busy;
    d["busy_wait_s"] = s.busy_wait_seconds;
    d["last_stall_s"] = s.last_stall_seconds;
    d["last_snapshot_s"] = s.last_snapshot_seconds;
    d["last_persist_s"] = s.last_persist_seconds;
    d["last_bytes"] = s.last_bytes;
    d["bytes_written"] = s.bytes_written;
    d["last_published_step"] = s.last_published_step;
    d["pinned_snapshot"] = s.pinned_snapshot;
    d["interval_s"] = s.interval_seconds;
    d["expected_overhead"] = s.expected_overhead;
    return d;
  }

  void Close() {
    if (!checkpointer_) return;
    py::gil_scoped_release release;
    checkpointer_.reset();
  }

 private:
  std::unique_ptr<stoker::Checkpointer> checkpointer_;
};

// A loaded checkpoint as Python sees it: metadata plus tensors as uint8
// DLPack capsules over the mapped files (torch views them as their dtype).
py::dict ToPython(stoker::Result<stoker::LoadedCheckpoint> result) {
  auto loaded = std::make_shared<stoker::LoadedCheckpoint>(Unwrap(std::move(result)));
  py::dict d;
  d["step"] = loaded->step;
  d["path"] = loaded->path;
  d["loader_state"] = LoaderStateTo(loaded->extras.loader_state);
  d["rng_states"] = loaded->extras.rng_states;
  d["metadata"] = loaded->extras.metadata;
  d["metric"] = loaded->extras.metric ? py::cast(*loaded->extras.metric) : py::none();
  d["user_json"] = loaded->extras.user_json;
  d["skipped"] = loaded->skipped;
  py::list tensors;
  static std::byte empty_tensor_data[8];  // DLPack wants a pointer even for no bytes
  for (auto& t : loaded->tensors) {
    void* data = t.data.empty() ? empty_tensor_data : t.data.data();
    const auto bytes = static_cast<std::int64_t>(t.data.size());
    tensors.append(py::make_tuple(t.name, std::string(stoker::TensorDTypeName(t.dtype)), t.shape,
                                  MakeCapsule(loaded, data, 1, {bytes, 0, 0, 0}, {kDLUInt, 8, 1})));
  }
  d["tensors"] = tensors;
  return d;
}

}  // namespace

void BindCheckpoint(py::module_& m) {
  py::class_<PyCheckpointer>(m, "Checkpointer")
      .def(py::init([](const std::string& directory, std::uint32_t keep_last, std::uint32_t keep_best,
                       bool higher_is_better, const std::string& when_busy, std::uint64_t max_file_bytes,
                       const std::string& interval, std::uint64_t every_steps, double every_seconds,
                       double mtbf_seconds, std::uint32_t copy_threads, bool replace_existing) {
             stoker::CheckpointOptions o;
             o.directory = directory;
             o.keep_last = keep_last;
             o.keep_best = keep_best;
             o.higher_metric_is_better = higher_is_better;
             if (when_busy == "wait") {
               o.when_busy = stoker::WhenBusy::kWait;
             } else if (when_busy == "skip") {
               o.when_busy = stoker::WhenBusy::kSkip;
             } else {
               throw py::value_error("when_busy must be 'wait' or 'skip', not '" + when_busy + "'");
             }
             o.max_file_bytes = max_file_bytes;
             if (interval == "steps") {
               o.interval_mode = stoker::IntervalMode::kSteps;
             } else if (interval == "seconds") {
               o.interval_mode = stoker::IntervalMode::kSeconds;
             } else if (interval == "auto") {
               o.interval_mode = stoker::IntervalMode::kAuto;
             } else {
               throw py::value_error("interval must be 'steps', 'seconds' or 'auto'");
             }
             o.every_steps = every_steps;
             o.every_seconds = every_seconds;
             o.mtbf_seconds = mtbf_seconds;
             o.copy_threads = copy_threads;
             o.replace_existing = replace_existing;
             return std::make_unique<PyCheckpointer>(std::move(o));
           }),
           py::arg("directory"), py::arg("keep_last"), py::arg("keep_best"), py::arg("higher_is_better"),
           py::arg("when_busy"), py::arg("max_file_bytes"), py::arg("interval"), py::arg("every_steps"),
           py::arg("every_seconds"), py::arg("mtbf_seconds"), py::arg("copy_threads"), py::arg("replace_existing"))
      .def("save", &PyCheckpointer::Save)
      .def("wait", &PyCheckpointer::Wait)
      .def("due", &PyCheckpointer::Due)
      .def("stats", &PyCheckpointer::Stats)
      .def("close", &PyCheckpointer::Close);

  m.def("load_checkpoint", [](const std::string& path, bool verify) {
    stoker::LoadOptions o;
    o.verify_checksums = verify;
    stoker::Result<stoker::LoadedCheckpoint> r = stoker::Status::Internal("unset");
    {
      py::gil_scoped_release release;
      r = stoker::LoadCheckpoint(path, o);
    }
    return ToPython(std::move(r));
  });
  m.def("load_latest_checkpoint", [](const std::string& directory, bool verify, bool skip_corrupt) {
    stoker::LoadOptions o;
    o.verify_checksums = verify;
    o.skip_corrupt = skip_corrupt;
    stoker::Result<stoker::LoadedCheckpoint> r = stoker::Status::Internal("unset");
    {
      py::gil_scoped_release release;
      r = stoker::LoadLatestCheckpoint(directory, o);
    }
    return ToPython(std::move(r));
  });
  m.def("load_safetensors", [](const std::string& path) {
    stoker::Result<stoker::LoadedCheckpoint> r = stoker::Status::Internal("unset");
    {
      py::gil_scoped_release release;
      r = stoker::LoadSafetensorsFile(path);
    }
    return ToPython(std::move(r));
  });
  m.def("list_checkpoints", [](const std::string& directory) {
    py::list out;
    for (const auto& c : Unwrap(stoker::ListCheckpoints(directory))) {
      py::dict d;
      d["step"] = c.step;
      d["path"] = c.path;
      d["bytes"] = c.bytes;
      d["metric"] = c.metric ? py::cast(*c.metric) : py::none();
      out.append(d);
    }
    return out;
  });
}

}  // namespace stoker_python
