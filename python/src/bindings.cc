// pybind11 bindings: the _native module under the `stoker` Python package.
// Status errors become Python exceptions; batches reach torch as zero-copy
// DLPack tensors whose deleter gives the buffer back to the loader's pool.
#include <dlpack/dlpack.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <string>

#include "common.h"
#include "stoker/byte_size.h"
#include "stoker/dataset.h"
#include "stoker/device.h"
#include "stoker/device_loader.h"
#include "stoker/loader.h"
#include "stoker/open.h"
#include "stoker/remote.h"

namespace py = pybind11;

namespace {

using stoker_python::MakeCapsule;
using stoker_python::Raise;
using stoker_python::Unwrap;

// Drops `owner` without holding the GIL where this thread holds it: the last
// owner of a loader stops its threads and, for remote data, waits for its
// downloads, which may need other Python threads (a server in the same
// process, say). Deleters may also run on threads that never held the GIL.
template <typename T>
void ResetWithoutGil(std::shared_ptr<T>& owner) {
  if (owner.use_count() == 1 && PyGILState_Check()) {
    py::gil_scoped_release release;
    owner.reset();
  } else {
    owner.reset();
  }
}

// Owns one batch for as long as any tensor made from it is alive, and the
// loader for as long as any batch is.
struct BatchHolder {
  std::shared_ptr<stoker::Loader> loader;
  std::optional<stoker::Batch> batch;
  ~BatchHolder() {
    batch.reset();  // release before the loader may go
    ResetWithoutGil(loader);
  }
};

DLDataType ToDL(stoker::DType dtype) {
  switch (dtype) {
    case stoker::DType::kUint8:
      return {kDLUInt, 8, 1};
    case stoker::DType::kFloat32:
      return {kDLFloat, 32, 1};
    case stoker::DType::kFloat16:
      return {kDLFloat, 16, 1};
    case stoker::DType::kBFloat16:
      return {kDLBfloat, 16, 1};
  }
  return {kDLUInt, 8, 1};
}

// Keeps a device batch's buffer out of the pool while any tensor made from
// it lives; gives it back (after the consumer stream's work) when freed.
struct DeviceBatchHolder {
  std::shared_ptr<stoker::DeviceLoader> loader;
  stoker::DeviceBatchView view;
  void* stream = nullptr;
  ~DeviceBatchHolder() {
    (void)loader->Release(view, stream);
    ResetWithoutGil(loader);
  }
};
struct HostVectors {
  std::vector<std::int64_t> labels;
  std::vector<std::uint64_t> indices;
};

class PyLoader {
 public:
  PyLoader(const std::string& path, stoker::LoaderOptions options, const std::string& device, bool gpu_preprocess,
           bool gpu_decode, const stoker::RemoteOptions& remote, bool stage_ahead) {
    stoker::Result<std::unique_ptr<stoker::Dataset>> opened = stoker::Status::Internal("unset");
    stoker::OpenOptions open;
    open.remote = remote;
    {
      // Opening a remote dataset fetches its index: never with the GIL held.
      py::gil_scoped_release release;
      opened = stoker::OpenDataset(path, open);
    }
    std::shared_ptr<const stoker::Dataset> dataset = Unwrap(std::move(opened));
    dataset_ = dataset;
    loose_files_ = dataset->loose_files();
    const stoker::ResolvedDevice resolved = Unwrap(stoker::ResolveDevice(device));
    device_note_ = resolved.note;
    device_ = resolved.device;
    // Typed fields are decoded on the CPU loader; Python moves their tensors
    // to the device (stoker/_device_mover.py's DeviceMover).
    if (device_.kind == stoker::DeviceKind::kCuda && options.fields.empty()) {
      // The GPU finishes preprocessing only where batches go to a GPU.
      stoker::DeviceLoaderOptions device_options;
      device_options.finish_on_device = gpu_preprocess || gpu_decode;
      device_options.decode_on_device = gpu_decode;
      device_options.stage_ahead = stage_ahead;
      gpu_preprocess_ = device_options.finish_on_device;
      stoker::Result<std::unique_ptr<stoker::DeviceLoader>> made = stoker::Status::Internal("unset");
      {
        py::gil_scoped_release release;
        made = stoker::DeviceLoader::Create(dataset, options, device_, device_options);
      }
      device_loader_ = std::shared_ptr<stoker::DeviceLoader>(Unwrap(std::move(made)).release());
    } else {
      loader_ = std::shared_ptr<stoker::Loader>(Unwrap(stoker::Loader::Create(dataset, options)).release());
    }
  }

  ~PyLoader() {
    ResetWithoutGil(device_loader_);
    ResetWithoutGil(loader_);
    ResetWithoutGil(dataset_);
  }

  stoker::Loader& L() { return device_loader_ ? device_loader_->loader() : *loader_; }

  // Waits for `next()` (a call of the native loader with a timeout) in
  // short slices without the GIL, looking for signals between them, so that
  // Ctrl-C interrupts a training loop waiting for data.
  template <typename NextFn>
  static auto WaitInterruptibly(NextFn next) {
    constexpr auto kSlice = std::chrono::milliseconds(100);
    for (;;) {
      decltype(next(kSlice)) result = stoker::Status::Internal("unset");
      {
        py::gil_scoped_release release;
        result = next(kSlice);
      }
      if (result.ok() || result.error().code() != stoker::StatusCode::kDeadlineExceeded) return result;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  }

  // (images, labels, indices) capsules, or None at the end of the epoch.
  py::object Next(std::uintptr_t stream) {
    if (device_loader_) return NextOnDevice(reinterpret_cast<void*>(stream));
    auto next = WaitInterruptibly([&](std::chrono::nanoseconds slice) { return loader_->Next(slice); });
    if (!next.ok()) Raise(next.error());
    if (!next->has_value()) return py::none();
    auto holder = std::make_shared<BatchHolder>();
    holder->loader = loader_;
    holder->batch = std::move(**next);
    stoker::Batch& b = *holder->batch;
    const auto n = static_cast<std::int64_t>(b.size());
    py::capsule images = MakeCapsule(holder, b.images(), 4, b.shape(), ToDL(b.dtype()));
    py::capsule labels = MakeCapsule(holder, const_cast<std::int64_t*>(b.labels()), 1, {n, 0, 0, 0}, {kDLInt, 64, 1});
    py::capsule indices =
        MakeCapsule(holder, const_cast<std::uint64_t*>(b.indices()), 1, {n, 0, 0, 0}, {kDLInt, 64, 1});
    return py::make_tuple(images, labels, indices, b.epoch(), b.batch_index(),
                          stoker_python::FieldsToPython(b, holder));
  }

  py::object NextOnDevice(void* stream) {
    auto next = WaitInterruptibly([&](std::chrono::nanoseconds slice) { return device_loader_->Next(stream, slice); });
    if (!next.ok()) Raise(next.error());
    if (!next->has_value()) return py::none();
    auto holder = std::make_shared<DeviceBatchHolder>();
    holder->loader = device_loader_;
    holder->view = std::move(**next);
    holder->stream = stream;
    auto host = std::make_shared<HostVectors>();
    host->labels = holder->view.labels;
    host->indices = holder->view.indices;
    const auto n = static_cast<std::int64_t>(host->labels.size());
    const auto& v = holder->view;
    py::capsule images =
        MakeCapsule(holder, v.images, 4, v.shape, ToDL(v.dtype), {kDLCUDA, static_cast<std::int32_t>(v.device_index)});
    py::capsule labels = MakeCapsule(host, host->labels.data(), 1, {n, 0, 0, 0}, {kDLInt, 64, 1});
    py::capsule indices = MakeCapsule(host, host->indices.data(), 1, {n, 0, 0, 0}, {kDLInt, 64, 1});
    return py::make_tuple(images, labels, indices, v.epoch, v.batch_index, py::none());
  }

  std::shared_ptr<stoker::Loader> loader_;
  std::shared_ptr<stoker::DeviceLoader> device_loader_;
  stoker::Device device_;
  std::string device_note_;
  bool loose_files_ = false;
  bool gpu_preprocess_ = false;
  std::shared_ptr<const stoker::Dataset> dataset_;
};

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "stoker's native core (use the `stoker` package, not this module directly)";
  m.def("_set_exceptions", &stoker_python::SetExceptions);
  stoker_python::BindCheckpoint(m);

  py::enum_<stoker::DType>(m, "DType")
      .value("uint8", stoker::DType::kUint8)
      .value("float32", stoker::DType::kFloat32)
      .value("float16", stoker::DType::kFloat16)
      .value("bfloat16", stoker::DType::kBFloat16);
  py::enum_<stoker::Layout>(m, "Layout").value("NCHW", stoker::Layout::kNCHW).value("NHWC", stoker::Layout::kNHWC);
  py::enum_<stoker::Order>(m, "Order")
      .value("sequential", stoker::Order::kSequential)
      .value("shuffle", stoker::Order::kShuffle)
      .value("shard_block", stoker::Order::kShardBlockShuffle)
      .value("auto", stoker::Order::kAuto);
  py::enum_<stoker::KernelReadahead>(m, "KernelReadahead")
      .value("auto", stoker::KernelReadahead::kAuto)
      .value("on", stoker::KernelReadahead::kOn)
      .value("off", stoker::KernelReadahead::kOff);
  py::enum_<stoker::CorruptPolicy>(m, "CorruptPolicy")
      .value("error", stoker::CorruptPolicy::kError)
      .value("skip", stoker::CorruptPolicy::kSkip);
  py::enum_<stoker::TransformOptions::Kind>(m, "TransformKind")
      .value("random_resized_crop", stoker::TransformOptions::Kind::kRandomResizedCrop)
      .value("resize_center_crop", stoker::TransformOptions::Kind::kResizeCenterCrop)
      .value("none", stoker::TransformOptions::Kind::kNone);
  py::enum_<stoker::TransformOptions::Interpolation>(m, "ResizeInterpolation")
      .value("bilinear", stoker::TransformOptions::Interpolation::kBilinear)
      .value("bicubic", stoker::TransformOptions::Interpolation::kBicubic);

  py::class_<stoker::TransformOptions>(m, "TransformOptions")
      .def(py::init<>())
      .def_readwrite("kind", &stoker::TransformOptions::kind)
      .def_readwrite("height", &stoker::TransformOptions::height)
      .def_readwrite("width", &stoker::TransformOptions::width)
      .def_readwrite("scale", &stoker::TransformOptions::scale)
      .def_readwrite("ratio", &stoker::TransformOptions::ratio)
      .def_readwrite("flip_probability", &stoker::TransformOptions::flip_probability)
      .def_readwrite("resize", &stoker::TransformOptions::resize)
      .def_readwrite("interpolation", &stoker::TransformOptions::interpolation)
      .def_readwrite("normalize", &stoker::TransformOptions::normalize)
      .def_readwrite("mean", &stoker::TransformOptions::mean)
      .def_readwrite("std", &stoker::TransformOptions::std)
      .def_readwrite("dtype", &stoker::TransformOptions::dtype)
      .def_readwrite("layout", &stoker::TransformOptions::layout)
      .def_readwrite("dct_scaling", &stoker::TransformOptions::dct_scaling)
      .def_readwrite("max_pixels", &stoker::TransformOptions::max_pixels)
      .def_readwrite("before_crop", &stoker::TransformOptions::before_crop)
      .def_readwrite("after_crop", &stoker::TransformOptions::after_crop)
      .def_readwrite("after_normalize", &stoker::TransformOptions::after_normalize);

  stoker_python::BindTokens(m);
  stoker_python::BindFields(m);  // FieldSpec, before LoaderOptions names it
  py::class_<stoker::LoaderOptions>(m, "LoaderOptions")
      .def(py::init<>())
      .def_readwrite("batch_size", &stoker::LoaderOptions::batch_size)
      .def_readwrite("shuffle", &stoker::LoaderOptions::shuffle)
      .def_readwrite("order", &stoker::LoaderOptions::order)
      .def_readwrite("shard_window", &stoker::LoaderOptions::shard_window)
      .def_readwrite("seed", &stoker::LoaderOptions::seed)
      .def_readwrite("drop_last", &stoker::LoaderOptions::drop_last)
      .def_readwrite("rank", &stoker::LoaderOptions::rank)
      .def_readwrite("world_size", &stoker::LoaderOptions::world_size)
      .def_readwrite("global_batch_size", &stoker::LoaderOptions::global_batch_size)
      .def_readwrite("min_world_size", &stoker::LoaderOptions::min_world_size)
      .def_readwrite("threads", &stoker::LoaderOptions::threads)
      .def_readwrite("prefetch", &stoker::LoaderOptions::prefetch)
      .def_readwrite("transform", &stoker::LoaderOptions::transform)
      .def_readwrite("on_corrupt", &stoker::LoaderOptions::on_corrupt)
      .def_readwrite("image_field", &stoker::LoaderOptions::image_field)
      .def_readwrite("fields", &stoker::LoaderOptions::fields)
      .def_readwrite("verify_samples", &stoker::LoaderOptions::verify_samples)
      .def_readwrite("read_crop_rows", &stoker::LoaderOptions::read_crop_rows)
      .def_readwrite("kernel_readahead", &stoker::LoaderOptions::kernel_readahead)
      .def_readwrite("autotune", &stoker::LoaderOptions::autotune)
      .def_readwrite("autotune_max_threads", &stoker::LoaderOptions::autotune_max_threads)
      .def_readwrite("autotune_memory_bytes", &stoker::LoaderOptions::autotune_memory_bytes);

  py::class_<stoker::LoaderStats>(m, "LoaderStats")
      .def("since", &stoker::LoaderStats::Since)
      .def("summary", &stoker::LoaderStats::Summary)
      .def("as_dict", [](const stoker::LoaderStats& s) {
        py::dict d;
        d["batches"] = s.batches;
        d["samples"] = s.samples;
        d["bytes_read"] = s.bytes_read;
        d["samples_read"] = s.samples_read;
        d["corrupt_skipped"] = s.corrupt_skipped;
        d["wait_s"] = s.wait_seconds;
        d["read_s"] = s.read_seconds;
        d["decode_s"] = s.decode_seconds;
        d["transform_s"] = s.transform_seconds;
        d["mean_ready_batches"] = s.mean_ready_batches;
        d["threads"] = s.threads;
        d["shard_window"] = s.shard_window;
        d["order"] = s.order == stoker::Order::kShardBlockShuffle ? "shard_block"
                     : s.order == stoker::Order::kSequential      ? "sequential"
                                                                  : "shuffle";
        d["predicted_epoch_download_bytes"] = s.predicted_epoch_download_bytes;
        d["order_note"] = s.order_note;
        d["order_warning"] = s.order_warning;
        d["corrupt_note"] = s.corrupt_note;
        d["prefetch"] = s.prefetch;
        d["autotune"] = s.autotune;
        d["autotune_changes"] = s.autotune_changes;
        d["autotune_last_change_batch"] = s.autotune_last_change_batch;
        d["pinned_memory"] = s.pinned_memory;
        d["batch_buffers_touched"] = s.batch_buffers_touched;
        d["read_requests"] = s.read_requests;
        d["read_method"] = s.read_method;
        d["seekable_decodes"] = s.seekable_decodes;
        d["seekable_fallbacks"] = s.seekable_fallbacks;
        d["seekable_part_reads"] = s.seekable_part_reads;
        d["seekable_part_rereads"] = s.seekable_part_rereads;
        d["kernel_readahead"] = s.kernel_readahead;
        d["readahead_note"] = s.readahead_note;
        return d;
      });

  py::class_<PyLoader>(m, "Loader")
      .def(py::init<const std::string&, stoker::LoaderOptions, const std::string&, bool, bool,
                    const stoker::RemoteOptions&, bool>(),
           py::arg("path"), py::arg("options"), py::arg("device"), py::arg("gpu_preprocess"), py::arg("gpu_decode"),
           py::arg("remote"), py::arg("stage_ahead") = true)
      .def("remote_stats",
           [](PyLoader& l) {
             const stoker::RemoteStats r = stoker::GetRemoteStats(*l.dataset_);
             py::dict d;
             d["hits"] = r.hits;
             d["misses"] = r.misses;
             d["downloads"] = r.downloads;
             d["bytes_downloaded"] = r.bytes_downloaded;
             d["evictions"] = r.evictions;
             d["retries"] = r.retries;
             d["connections"] = r.connections;
             d["adopted"] = r.adopted;
             d["over_capacity"] = r.over_capacity;
             d["wait_s"] = r.wait_seconds;
             return d;
           })
      .def("next", &PyLoader::Next, py::arg("stream") = 0)
      .def_property_readonly("device", [](PyLoader& l) { return l.device_.ToString(); })
      .def_property_readonly("device_note", [](PyLoader& l) { return l.device_note_; })
      .def_property_readonly("gpu_preprocess", [](PyLoader& l) { return l.gpu_preprocess_; })
      .def("device_stats",
           [](PyLoader& l) {
             py::dict d;
             if (!l.device_loader_) return d;
             const auto s = l.device_loader_->stats();
             d["batches"] = s.batches;
             d["copy_s"] = s.copy_seconds;
             d["copied_bytes"] = s.copied_bytes;
             d["submit_s"] = s.submit_seconds;
             d["device_fallbacks"] = s.device_fallbacks;
             d["device_cpu_warps"] = s.device_cpu_warps;
             d["device_cpu_steps"] = s.device_cpu_steps;
             if (!s.device_decoder.empty()) {
               d["decoder"] = s.device_decoder;
               d["decoded_on_device"] = s.decoded_on_device;
               d["decoded_on_hardware"] = s.decoded_on_hardware;
               d["decode_no_room"] = s.decode_no_room;
               d["decode_batch_failures"] = s.decode_batch_failures;
               d["decode_cpu_after_error"] = s.decode_cpu_after_error;
               d["decode_corrupt_skipped"] = s.decode_corrupt_skipped;
               py::dict reasons;
               for (const auto& [reason, n] : s.decoded_on_cpu_by_reason) reasons[py::str(reason)] = n;
               d["decoded_on_cpu_by_reason"] = reasons;
             }
             return d;
           })
      .def("set_epoch",
           [](PyLoader& l, std::uint64_t e) {
             py::gil_scoped_release release;
             if (l.device_loader_) return l.device_loader_->SetEpoch(e);
             l.L().SetEpoch(e);
           })
      .def_property_readonly("epoch",
                             [](PyLoader& l) {
                               py::gil_scoped_release release;  // waits for a staged batch's submission
                               return l.device_loader_ ? l.device_loader_->epoch() : l.L().epoch();
                             })
      .def("autotune_log", [](PyLoader& l) { return l.L().AutotuneLog(); })
      .def_property_readonly("batches_per_epoch", [](PyLoader& l) { return l.L().batches_per_epoch(); })
      .def_property_readonly("samples_per_epoch", [](PyLoader& l) { return l.L().samples_per_epoch(); })
      .def_property_readonly("batch_capacity", [](PyLoader& l) { return l.L().batch_capacity(); })
      .def("reshard",
           [](PyLoader& l, std::uint32_t rank, std::uint32_t world_size) {
             stoker::Status status;
             {
               py::gil_scoped_release release;
               status =
                   l.device_loader_ ? l.device_loader_->Reshard(rank, world_size) : l.L().Reshard(rank, world_size);
             }
             if (!status.ok()) Raise(status);
           })
      .def_property_readonly("rank", [](PyLoader& l) { return l.L().rank(); })
      .def_property_readonly("world_size", [](PyLoader& l) { return l.L().world_size(); })
      .def_property_readonly("loose_files", [](PyLoader& l) { return l.loose_files_; })
      .def_property_readonly("class_names", [](PyLoader& l) { return l.dataset_->class_names(); })
      .def("state",
           [](PyLoader& l) {
             stoker::LoaderState state;
             {
               py::gil_scoped_release release;
               state = l.device_loader_ ? l.device_loader_->State() : l.L().state();
             }
             return stoker_python::LoaderStateToDict(state);
           })
      .def("restore",
           [](PyLoader& l, const py::dict& d) {
             const stoker::LoaderState s = stoker_python::LoaderStateFromDict(d);
             stoker::Status status;
             {
               py::gil_scoped_release release;
               status = l.device_loader_ ? l.device_loader_->Restore(s) : l.L().Restore(s);
             }
             if (!status.ok()) Raise(status);
           })
      .def("stats", [](PyLoader& l) { return l.L().stats(); });

  stoker_python::BindPack(m);
  m.def("parse_byte_size", [](const std::string& text) { return Unwrap(stoker::ParseByteSize(text)); });
  m.def("cuda_status", [] {
    const stoker::CudaAvailability a = stoker::QueryCuda();
    py::dict d;
    d["built_with_cuda"] = a.built_with_cuda;
    d["device_count"] = a.device_count;
    d["reason"] = a.reason;
    return d;
  });
  m.def("num_samples", [](const std::string& path) { return Unwrap(stoker::OpenDataset(path))->num_samples(); });
  stoker_python::BindOrderTools(m);
  stoker_python::BindAugment(m);
  stoker_python::BindDecoders(m);
  py::class_<stoker::RemoteOptions>(m, "RemoteOptions")
      .def(py::init<>())
      .def_property(
          "cache_dir", [](const stoker::RemoteOptions& o) { return o.cache.dir; },
          [](stoker::RemoteOptions& o, const std::string& v) { o.cache.dir = v; })
      .def_property(
          "cache_size", [](const stoker::RemoteOptions& o) { return o.cache.capacity_bytes; },
          [](stoker::RemoteOptions& o, std::uint64_t v) { o.cache.capacity_bytes = v; })
      .def_property(
          "cache_min_free", [](const stoker::RemoteOptions& o) { return o.cache.min_free_bytes; },
          [](stoker::RemoteOptions& o, std::uint64_t v) { o.cache.min_free_bytes = v; })
      .def_readwrite("connections", &stoker::RemoteOptions::connections)
      .def_readwrite("max_attempts", &stoker::RemoteOptions::max_attempts)
      .def_readwrite("stall_timeout_seconds", &stoker::RemoteOptions::stall_timeout_seconds)
      .def_readwrite("fetch_deadline_seconds", &stoker::RemoteOptions::fetch_deadline_seconds);
}
