// Bindings for stoker::Checkpointer and the checkpoint readers. The Python
// package (stoker/checkpoint.py) flattens torch state dicts into the flat
// (name, dtype, shape, pointer) list taken here and rebuilds them on load.
#include <pybind11/stl.h>

#include <algorithm>
#include <charconv>
#include <tuple>

#include <xxhash.h>

#include "common.h"
#include "state_flatten.h"
#include "stoker/checkpoint.h"
#include "stoker/sharded_checkpoint.h"

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

class PyCheckpointer {
 public:
  explicit PyCheckpointer(stoker::CheckpointOptions options)
      : checkpointer_(Unwrap(stoker::Checkpointer::Open(std::move(options)))) {}

  // `flat`: the state as flatten_state() made it; `extra_json`: the user's
  // `extra`, JSON-encoded, or None. Returns True when started, False when
  // skipped because a persist was in flight.
  // Sharded: `write` (one flag per tensor of `flat`) says which this rank
  // writes (the others are written by another rank holding a replica), and
  // `save_id` names the collective save.
  bool Save(std::int64_t step, const FlatState& flat, const py::object& loader_state,
            const std::map<std::string, std::string>& rng_states, const std::map<std::string, std::string>& metadata,
            std::optional<double> metric, const std::optional<std::string>& extra_json,
            const std::optional<std::vector<bool>>& write, const std::string& save_id) {
    stoker::CheckpointExtras extras;
    extras.loader_state = LoaderStateFrom(loader_state);
    extras.rng_states = rng_states;
    extras.metadata = metadata;
    extras.metric = metric;
    if (!flat.structure().empty() || extra_json) {  // {"structure": ..., "extra": ...}, either optional
      std::string& user = extras.user_json;
      user.reserve(flat.structure().size() + (extra_json ? extra_json->size() : 0) + 32);
      user = "{";
      if (!flat.structure().empty()) user += "\"structure\":" + flat.structure();
      if (extra_json) user += std::string(flat.structure().empty() ? "" : ",") + "\"extra\":" + *extra_json;
      user += '}';
    }
    stoker::Result<stoker::SaveOutcome> outcome = stoker::Status::Internal("unset");
    {
      // `flat` keeps the tensors alive; training threads that do not touch
      // them may run while we copy.
      py::gil_scoped_release release;
      if (write) {
        if (write->size() != flat.tensors().size())
          outcome = stoker::Status::InvalidArgument("the write mask does not match the state's tensors");
        else {
          std::vector<stoker::TensorRef> mine;
          for (std::size_t i = 0; i < write->size(); ++i)
            if ((*write)[i]) mine.push_back(flat.tensors()[i]);
          outcome = checkpointer_->Save(step, mine, extras, save_id);
        }
      } else {
        outcome = checkpointer_->Save(step, flat.tensors(), extras, save_id);
      }
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

  // [(index among the tensors saved, address, bytes)] of the last snapshot:
  // valid until the next save() (describe_snapshots=True).
  py::list LastSnapshot() const {
    py::list out;
    for (const stoker::SnapshotTensor& t : checkpointer_->LastSnapshot())
      out.append(py::make_tuple(t.source, reinterpret_cast<std::uintptr_t>(t.data.data()), t.data.size()));
    return out;
  }

  bool Due(std::int64_t step) const { return checkpointer_->Due(step); }
  bool Busy() const { return checkpointer_->Busy(); }
  bool Failed() const { return checkpointer_->Failed(); }

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

// A loaded checkpoint as Python sees it: metadata, and the tensors in runs:
// consecutive tensors of one dtype that lie back to back in one file become
// one uint8 DLPack capsule over the mapped file (torch views it as the dtype
// and splits it in one call), with the run's names, shapes and element
// counts. A stoker checkpoint has about one run per dtype and file, so
// making tens of thousands of tensors costs one torch view each.
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
  py::list runs;
  static std::byte empty_run_data[8];  // DLPack wants a pointer even for no bytes
  const auto& tensors = loaded->tensors;
  for (std::size_t begin = 0; begin < tensors.size();) {
    std::size_t end = begin + 1;
    std::size_t bytes = tensors[begin].data.size();
    while (end < tensors.size() && tensors[end].dtype == tensors[begin].dtype &&
           tensors[end].data.data() == tensors[begin].data.data() + bytes) {
      bytes += tensors[end].data.size();
      ++end;
    }
    py::list names, shapes, numels;
    for (std::size_t i = begin; i < end; ++i) {
      names.append(py::str(tensors[i].name));
      shapes.append(py::cast(tensors[i].shape));
      numels.append(tensors[i].data.size() / stoker::TensorDTypeSize(tensors[i].dtype));
    }
    void* data = bytes == 0 ? empty_run_data : tensors[begin].data.data();
    runs.append(
        py::make_tuple(std::string(stoker::TensorDTypeName(tensors[begin].dtype)),
                       MakeCapsule(loaded, data, 1, {static_cast<std::int64_t>(bytes), 0, 0, 0}, {kDLUInt, 8, 1}),
                       names, shapes, numels));
    begin = end;
  }
  d["runs"] = runs;
  return d;
}

py::dict ExtrasToPython(const stoker::CheckpointExtras& e) {
  py::dict d;
  d["loader_state"] = LoaderStateTo(e.loader_state);
  d["rng_states"] = e.rng_states;
  d["metadata"] = e.metadata;
  d["metric"] = e.metric ? py::cast(*e.metric) : py::none();
  d["user_json"] = e.user_json;
  return d;
}

class PySharded {
 public:
  // `path`: a step-N folder, or a URL of one or of a checkpoint directory.
  PySharded(const std::string& path, bool verify, const std::optional<stoker::RemoteOptions>& remote) {
    stoker::LoadOptions o;
    o.verify_checksums = verify;
    stoker::Result<std::unique_ptr<stoker::ShardedCheckpoint>> opened = stoker::Status::Internal("unset");
    {
      py::gil_scoped_release release;
      opened = stoker::OpenShardedCheckpointAt(path, o, remote ? *remote : stoker::RemoteOptions{});
    }
    checkpoint_ = Unwrap(std::move(opened));  // (raising needs the GIL)
  }
  // [(name, safetensors dtype, global shape)]
  py::list Tensors() const {
    py::list out;
    for (const auto& t : checkpoint_->tensors())
      out.append(py::make_tuple(t.name, std::string(stoker::TensorDTypeName(t.dtype)), py::tuple(py::cast(t.shape))));
    return out;
  }
  py::dict RankExtras(std::uint32_t rank) const { return ExtrasToPython(Unwrap(checkpoint_->RankExtras(rank))); }
  // requests: [(name, offsets, shape, data pointer, bytes)]; the caller
  // keeps the memory alive and does not touch it until this returns.
  void ReadInto(const py::list& requests, std::uint32_t threads) {
    std::vector<std::string> names;
    std::vector<std::vector<std::uint64_t>> offsets, shapes;
    names.reserve(requests.size());
    offsets.reserve(requests.size());
    shapes.reserve(requests.size());
    std::vector<stoker::RegionRequest> regions;
    for (const auto& item : requests) {
      const auto r = item.cast<py::tuple>();
      names.push_back(r[0].cast<std::string>());
      offsets.push_back(r[1].cast<std::vector<std::uint64_t>>());
      shapes.push_back(r[2].cast<std::vector<std::uint64_t>>());
      auto* data = reinterpret_cast<std::byte*>(r[3].cast<std::uintptr_t>());
      regions.push_back({names.back(), offsets.back(), shapes.back(), {data, r[4].cast<std::size_t>()}});
    }
    stoker::Status s;
    {
      py::gil_scoped_release release;
      s = checkpoint_->ReadRegions(regions, threads);
    }
    Check(s);
  }
  py::dict Stats() const {
    const auto s = checkpoint_->stats();
    py::dict d;
    d["bytes_read"] = s.bytes_read;
    d["blocks_checked"] = s.blocks_checked;
    return d;
  }
  std::int64_t step() const { return checkpoint_->step(); }
  std::uint32_t world_size() const { return checkpoint_->world_size(); }
  const std::string& path() const { return checkpoint_->path(); }

 private:
  std::unique_ptr<stoker::ShardedCheckpoint> checkpoint_;
};

}  // namespace

void BindCheckpoint(py::module_& m) {
  BindStateFlatten(m);
  py::class_<PyCheckpointer>(m, "Checkpointer")
      .def(py::init([](const std::string& directory, std::uint32_t keep_last, std::uint32_t keep_best,
                       bool higher_is_better, const std::string& when_busy, std::uint64_t max_file_bytes,
                       const std::string& interval, std::uint64_t every_steps, double every_seconds,
                       double mtbf_seconds, std::uint32_t copy_threads, bool replace_existing, std::uint32_t rank,
                       std::uint32_t world_size, double commit_timeout_seconds, bool describe_snapshots) {
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
             o.rank = rank;
             o.world_size = world_size;
             o.commit_timeout_seconds = commit_timeout_seconds;
             o.describe_snapshots = describe_snapshots;
             return std::make_unique<PyCheckpointer>(std::move(o));
           }),
           py::arg("directory"), py::arg("keep_last"), py::arg("keep_best"), py::arg("higher_is_better"),
           py::arg("when_busy"), py::arg("max_file_bytes"), py::arg("interval"), py::arg("every_steps"),
           py::arg("every_seconds"), py::arg("mtbf_seconds"), py::arg("copy_threads"), py::arg("replace_existing"),
           py::arg("rank") = 0, py::arg("world_size") = 1, py::arg("commit_timeout_s") = 600.0,
           py::arg("describe_snapshots") = false)
      .def("save", &PyCheckpointer::Save, py::arg("step"), py::arg("flat"), py::arg("loader_state"),
           py::arg("rng_states"), py::arg("metadata"), py::arg("metric"), py::arg("extra_json"),
           py::arg("write") = py::none(), py::arg("save_id") = std::string())
      .def("last_snapshot", &PyCheckpointer::LastSnapshot)
      .def("busy", &PyCheckpointer::Busy)
      .def("failed", &PyCheckpointer::Failed)
      .def("wait", &PyCheckpointer::Wait)
      .def("due", &PyCheckpointer::Due)
      .def("stats", &PyCheckpointer::Stats)
      .def("close", &PyCheckpointer::Close);

  // xxh3-64 of a buffer's bytes (the in-memory checkpoint copies' checksum).
  m.def("xxh3", [](const py::buffer& data) {
    const py::buffer_info info = data.request();
    const auto bytes = static_cast<std::size_t>(info.size * info.itemsize);
    py::gil_scoped_release release;
    return static_cast<std::uint64_t>(XXH3_64bits(info.ptr, bytes));
  });

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
  py::class_<PySharded>(m, "ShardedCheckpoint")
      .def(py::init<const std::string&, bool, const std::optional<stoker::RemoteOptions>&>(), py::arg("path"),
           py::arg("verify") = true, py::arg("remote") = py::none())
      .def_property_readonly("step", &PySharded::step)
      .def_property_readonly("world_size", &PySharded::world_size)
      .def_property_readonly("path", &PySharded::path)
      .def("tensors", &PySharded::Tensors)
      .def("rank_extras", &PySharded::RankExtras)
      .def("read_into", &PySharded::ReadInto, py::arg("requests"), py::arg("threads") = 0)
      .def("stats", &PySharded::Stats);
  m.def("is_sharded_checkpoint", [](const std::string& path) {
    stoker::Result<bool> sharded = stoker::Status::Internal("unset");
    {
      py::gil_scoped_release release;
      sharded = stoker::IsShardedCheckpoint(path);
    }
    return Unwrap(std::move(sharded));
  });
  // step-N folders, newest first: (step, path, kind), kind "plain",
  // "sharded" or "unreadable" (no readable manifest).
  m.def("step_folders", [](const std::string& directory) {
    py::list out;
    std::vector<std::tuple<std::int64_t, std::string, std::string>> found;
    {
      py::gil_scoped_release release;
      auto* fs = stoker::FileSystem::Default();
      auto entries = fs->ListDirectory(directory);
      if (entries.ok()) {
        for (const auto& e : *entries) {
          if (e.type != stoker::FileType::kDirectory || !e.name.starts_with("step-")) continue;
          std::int64_t step = 0;
          const std::string digits = e.name.substr(5);
          auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
          if (ec != std::errc() || end != digits.data() + digits.size() || digits.empty() || step < 0 ||
              std::to_string(step) != digits)
            continue;
          const std::string path = directory + "/" + e.name;
          auto sharded = stoker::IsShardedCheckpoint(path);
          found.emplace_back(step, path, !sharded.ok() ? "unreadable" : *sharded ? "sharded" : "plain");
        }
      }
    }
    std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return std::get<0>(a) > std::get<0>(b); });
    for (const auto& [step, path, kind] : found) out.append(py::make_tuple(step, path, kind));
    return out;
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
