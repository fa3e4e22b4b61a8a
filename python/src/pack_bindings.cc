// Bindings for making datasets: stoker.pack (from files) and
// stoker.DatasetWriter (sample by sample, from Python).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "stoker/dataset_writer.h"
#include "stoker/merge.h"
#include "stoker/pack.h"

namespace stoker_python {
namespace {

py::dict SummaryDict(const stoker::PackSummary& s) {
  py::dict d;
  d["samples"] = s.samples;
  d["shards"] = s.shards;
  d["shard_bytes"] = s.shard_bytes;
  d["payload_bytes"] = s.payload_bytes;
  d["class_names"] = s.class_names;
  d["index_path"] = s.index_path;
  d["images_reencoded"] = s.images_reencoded;
  d["reencoded_bytes_before"] = s.reencoded_bytes_before;
  d["reencoded_bytes_after"] = s.reencoded_bytes_after;
  d["seekable_jpegs"] = s.seekable_jpegs;
  d["seekable_kept"] = s.seekable_kept;
  d["seekable_bytes_before"] = s.seekable_bytes_before;
  d["seekable_bytes_after"] = s.seekable_bytes_after;
  d["bad_images_kept"] = s.bad_images_kept;
  d["bad_images_named"] = s.bad_images_named;
  d["note"] = s.note;
  return d;
}

// A sample's fields as the writer takes them, over buffers the caller's
// Python objects keep alive (and unchanged: the GIL is released while the
// writer copies them out).
struct HeldFields {
  std::vector<py::buffer_info> buffers;
  std::vector<std::string> names;
  std::vector<stoker::SampleField> fields;
};

HeldFields Hold(const std::vector<std::tuple<std::string, py::buffer, stoker::FieldKind>>& given) {
  HeldFields held;
  held.buffers.reserve(given.size());
  held.names.reserve(given.size());
  for (const auto& [name, buffer, kind] : given) {
    held.buffers.push_back(buffer.request());
    const py::buffer_info& info = held.buffers.back();
    py::ssize_t stride = info.itemsize;  // C order: each dimension's stride the product of those after it
    for (py::ssize_t d = info.ndim - 1; d >= 0; stride *= info.shape[d], --d)
      if (info.shape[d] > 1 && info.strides[d] != stride)
        throw py::value_error("field '" + name + "': a buffer that is not contiguous (copy it, e.g. bytes(view))");
    held.names.push_back(name);
    held.fields.push_back(
        {held.names.back(),
         {static_cast<const std::byte*>(info.ptr), static_cast<std::size_t>(info.size * info.itemsize)},
         kind});
  }
  return held;
}

}  // namespace

void BindPack(py::module_& m) {
  m.def("pack", [](const std::string& source, const std::string& out, std::uint64_t shard_bytes, bool overwrite,
                   std::uint32_t max_side, int quality, std::optional<std::uint64_t> shuffle_seed,
                   std::vector<std::string> file_columns, bool seekable_jpeg, bool keep_bad_images, unsigned threads) {
    stoker::PackOptions options;
    options.threads = threads;
    options.seekable_jpeg = seekable_jpeg;
    options.keep_bad_images = keep_bad_images;
    options.file_columns = std::move(file_columns);
    options.target_shard_bytes = shard_bytes;
    options.overwrite = overwrite;
    options.max_side = max_side;
    options.quality = quality;
    options.shuffle = shuffle_seed.has_value();
    options.shuffle_seed = shuffle_seed.value_or(0);
    stoker::Result<stoker::PackSummary> summary = stoker::Status::Internal("unset");
    {
      py::gil_scoped_release release;
      summary = stoker::Pack(source, out, options);
    }
    return SummaryDict(Unwrap(std::move(summary)));
  });

  m.def("merge", [](const std::vector<std::string>& parts, const std::string& output, bool overwrite) {
    stoker::MergeOptions options;
    options.overwrite = overwrite;
    stoker::Result<stoker::MergeSummary> summary = stoker::Status::Internal("unset");
    {
      py::gil_scoped_release release;
      summary = stoker::MergeDatasets(parts, output, options);
    }
    auto merged = Unwrap(std::move(summary));
    py::dict d;
    d["index"] = merged.index_path;
    d["parts"] = merged.parts;
    d["samples"] = merged.samples;
    d["shards"] = merged.shards;
    d["shard_bytes"] = merged.shard_bytes;
    d["seekable_jpegs"] = merged.seekable_payloads;
    d["class_names"] = merged.class_names;
    return d;
  });

  m.def("conventional_field_kind", [](const std::string& name) { return stoker::ConventionalFieldKind(name); });

  py::class_<stoker::DatasetWriter>(m, "DatasetWriter")
      .def(py::init([](const std::string& out, std::uint64_t shard_bytes, bool overwrite,
                       std::vector<std::string> class_names, bool keep_bad_images) {
             stoker::DatasetWriterOptions options;
             options.keep_bad_images = keep_bad_images;
             options.target_shard_bytes = shard_bytes;
             options.overwrite = overwrite;
             options.class_names = std::move(class_names);
             stoker::Result<std::unique_ptr<stoker::DatasetWriter>> writer = stoker::Status::Internal("unset");
             {
               py::gil_scoped_release release;
               writer = stoker::DatasetWriter::Create(out, options);
             }
             return Unwrap(std::move(writer));
           }),
           py::arg("out"), py::arg("shard_bytes"), py::arg("overwrite"), py::arg("class_names"),
           py::arg("keep_bad_images"))
      .def(
          "add",
          [](stoker::DatasetWriter& w, const std::string& key,
             const std::vector<std::tuple<std::string, py::buffer, stoker::FieldKind>>& fields) {
            const HeldFields held = Hold(fields);
            stoker::Status status;
            {
              py::gil_scoped_release release;
              status = w.Add(key, held.fields);
            }
            Check(status);
          },
          py::arg("key"), py::arg("fields"))
      .def_property_readonly("samples", &stoker::DatasetWriter::samples)
      .def_property_readonly("payload_bytes", &stoker::DatasetWriter::payload_bytes)
      .def("finish", [](stoker::DatasetWriter& w) {
        stoker::Result<stoker::PackSummary> summary = stoker::Status::Internal("unset");
        {
          py::gil_scoped_release release;
          summary = w.Finish();
        }
        return SummaryDict(Unwrap(std::move(summary)));
      });
}

}  // namespace stoker_python
