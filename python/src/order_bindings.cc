// Bindings for looking at orders: a dataset's labels and shards, and the
// order a Loader reads it in (stoker.order_quality measures how close that
// comes to a global shuffle).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "common.h"
#include "stoker/loader.h"
#include "stoker/open.h"

namespace stoker_python {

void BindOrderTools(py::module_& m) {
  // What order_quality needs of a dataset: each sample's label and shard.
  m.def("dataset_layout", [](const std::string& path) {
    auto dataset = Unwrap(stoker::OpenDataset(path));
    const std::uint64_t n = dataset->num_samples();
    py::array_t<std::int64_t> labels(static_cast<py::ssize_t>(n));
    py::array_t<std::int64_t> shard_of_sample(static_cast<py::ssize_t>(n));
    auto l = labels.mutable_unchecked<1>();
    auto s = shard_of_sample.mutable_unchecked<1>();
    for (std::uint64_t i = 0; i < n; ++i) l(static_cast<py::ssize_t>(i)) = Unwrap(dataset->Sample(i)).label;
    std::vector<std::uint64_t> shard_samples;
    for (std::size_t k = 0; k < dataset->shards().size(); ++k) {
      const auto& shard = dataset->shards()[k];
      shard_samples.push_back(shard.num_samples);
      for (std::uint64_t i = 0; i < shard.num_samples; ++i)
        s(static_cast<py::ssize_t>(shard.first_sample + i)) = static_cast<std::int64_t>(k);
    }
    py::dict d;
    d["labels"] = labels;
    d["shard_of_sample"] = shard_of_sample;
    d["shard_samples"] = shard_samples;
    return d;
  });
  m.def("epoch_order", [](const std::string& path, stoker::Order order, std::uint32_t shard_window, std::uint64_t seed,
                          std::uint64_t epoch) {
    auto dataset = Unwrap(stoker::OpenDataset(path));
    const auto sequence = Unwrap(stoker::EpochSampleOrder(*dataset, order, shard_window, seed, epoch));
    py::array_t<std::int64_t> out(static_cast<py::ssize_t>(sequence.size()));
    auto o = out.mutable_unchecked<1>();
    for (std::size_t i = 0; i < sequence.size(); ++i)
      o(static_cast<py::ssize_t>(i)) = static_cast<std::int64_t>(sequence[i]);
    return out;
  });
}

}  // namespace stoker_python
