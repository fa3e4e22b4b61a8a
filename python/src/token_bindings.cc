// stoker.TokenLoader's native side: Megatron token datasets, the writer, the
// loader's batches as DLPack capsules, and SentencePiece for tokenize.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>
#include <utility>

#include "common.h"
#include "stoker/sentencepiece.h"
#include "stoker/tokens.h"

namespace stoker_python {
namespace {

class PyTokenLoader {
 public:
  PyTokenLoader(const std::vector<std::string>& prefixes, std::vector<double> weights,
                const stoker::TokenLoaderOptions& options, const stoker::RemoteOptions& remote,
                std::uint64_t chunk_bytes) {
    stoker::Result<std::unique_ptr<stoker::TokenLoader>> made = stoker::Status::Internal("unset");
    {
      py::gil_scoped_release release;
      for (const auto& prefix : prefixes) {
        stoker::TokenDatasetOptions where;
        where.remote = remote;
        where.chunk_bytes = chunk_bytes;
        auto opened = stoker::TokenDataset::Open(prefix, where);
        if (!opened.ok()) {
          made = opened.error();
          break;
        }
        datasets_.emplace_back(std::move(*opened).release());
      }
      if (datasets_.size() == prefixes.size())
        made = stoker::TokenLoader::Create(datasets_, std::move(weights), options);
    }
    loader_ = Unwrap(std::move(made));
    with_documents_ = options.with_documents;
  }
  const std::vector<std::shared_ptr<const stoker::TokenDataset>>& datasets() const { return datasets_; }
  ~PyTokenLoader() {
    py::gil_scoped_release release;
    loader_.reset();
  }

  // A dict of capsules (input_ids, labels, position_ids, cu_seqlens), the
  // epoch and batch, the pieces when asked for; None at the epoch's end.
  py::object Next() {
    stoker::Result<std::optional<stoker::TokenBatch>> next = stoker::Status::Internal("unset");
    for (;;) {
      {
        py::gil_scoped_release release;
        next = loader_->Next(std::chrono::milliseconds(100));
      }
      if (next.ok() || next.error().code() != stoker::StatusCode::kDeadlineExceeded) break;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // Ctrl-C while waiting
    }
    auto batch = Unwrap(std::move(next));
    if (!batch) return py::none();
    auto owner = std::make_shared<stoker::TokenBatch>(std::move(*batch));
    const std::int64_t rows = owner->rows, seq = static_cast<std::int64_t>(owner->seq_len);
    const DLDataType i64{kDLInt, 64, 1}, i32{kDLInt, 32, 1};
    py::dict d;
    d["input_ids"] = MakeCapsule(owner, owner->input_ids.data(), {rows, seq}, i64);
    d["labels"] = MakeCapsule(owner, owner->labels.data(), {rows, seq}, i64);
    d["position_ids"] = MakeCapsule(owner, owner->position_ids.data(), {rows, seq}, i64);
    d["cu_seqlens"] =
        MakeCapsule(owner, owner->cu_seqlens.data(), {static_cast<std::int64_t>(owner->cu_seqlens.size())}, i32);
    d["epoch"] = owner->epoch;
    d["batch"] = owner->batch_index;
    d["first_row"] = owner->first_row;
    if (with_documents_) {
      py::list pieces;
      for (const auto& row : owner->pieces) {
        py::list r;
        for (const auto& p : row) r.append(py::make_tuple(p.dataset, p.document, p.offset, p.length));
        pieces.append(std::move(r));
      }
      d["documents"] = std::move(pieces);
    }
    return std::move(d);
  }

  stoker::TokenLoader& loader() { return *loader_; }
  std::uint64_t num_tokens() const {
    std::uint64_t n = 0;
    for (const auto& d : datasets_) n += d->num_tokens();
    return n;
  }
  std::uint64_t num_documents() const {
    std::uint64_t n = 0;
    for (const auto& d : datasets_) n += d->num_documents();
    return n;
  }

 private:
  std::vector<std::shared_ptr<const stoker::TokenDataset>> datasets_;
  std::unique_ptr<stoker::TokenLoader> loader_;
  bool with_documents_ = false;
};

// The state dict's keys, each a member of TokenLoaderState: both directions read this one list.
constexpr std::pair<const char*, std::uint64_t stoker::TokenLoaderState::*> kStateFields[] = {
    {"seed", &stoker::TokenLoaderState::seed},
    {"epoch", &stoker::TokenLoaderState::epoch},
    {"global_batch_size", &stoker::TokenLoaderState::global_batch_size},
    {"seq_len", &stoker::TokenLoaderState::seq_len},
    {"batches_consumed", &stoker::TokenLoaderState::batches_consumed},
    {"num_tokens", &stoker::TokenLoaderState::num_tokens},
    {"num_documents", &stoker::TokenLoaderState::num_documents},
    {"blend", &stoker::TokenLoaderState::blend},
};

py::dict StateToDict(const stoker::TokenLoaderState& s) {
  py::dict d;
  for (const auto& [key, member] : kStateFields) d[key] = s.*member;
  return d;
}

stoker::TokenLoaderState StateFromDict(const py::dict& d) {
  stoker::TokenLoaderState s;
  for (const auto& [key, member] : kStateFields) {
    if (!d.contains(key)) throw py::value_error(std::string("the token loader state has no '") + key + "'");
    s.*member = d[key].cast<std::uint64_t>();
  }
  return s;
}

}  // namespace

void BindTokens(py::module_& m) {
  py::class_<stoker::TokenLoaderOptions>(m, "TokenLoaderOptions")
      .def(py::init<>())
      .def_readwrite("seq_len", &stoker::TokenLoaderOptions::seq_len)
      .def_readwrite("global_batch_size", &stoker::TokenLoaderOptions::global_batch_size)
      .def_readwrite("rank", &stoker::TokenLoaderOptions::rank)
      .def_readwrite("world_size", &stoker::TokenLoaderOptions::world_size)
      .def_readwrite("seed", &stoker::TokenLoaderOptions::seed)
      .def_readwrite("shuffle", &stoker::TokenLoaderOptions::shuffle)
      .def_readwrite("pad_id", &stoker::TokenLoaderOptions::pad_id)
      .def_readwrite("ignore_index", &stoker::TokenLoaderOptions::ignore_index)
      .def_readwrite("labels_across_documents", &stoker::TokenLoaderOptions::labels_across_documents)
      .def_readwrite("vocab_size", &stoker::TokenLoaderOptions::vocab_size)
      .def_readwrite("prefetch", &stoker::TokenLoaderOptions::prefetch)
      .def_readwrite("read_ahead_batches", &stoker::TokenLoaderOptions::read_ahead_batches)
      .def_readwrite("with_documents", &stoker::TokenLoaderOptions::with_documents)
      .def_readwrite("kernel_readahead", &stoker::TokenLoaderOptions::kernel_readahead);

  py::class_<PyTokenLoader>(m, "TokenLoader")
      .def(py::init<const std::vector<std::string>&, std::vector<double>, const stoker::TokenLoaderOptions&,
                    const stoker::RemoteOptions&, std::uint64_t>())
      .def("next", &PyTokenLoader::Next)
      // Each dataset's remote cache figures (zeros for local ones).
      .def("remote_stats",
           [](PyTokenLoader& l) {
             py::list out;
             for (const auto& d : l.datasets()) {
               const stoker::RemoteStats s = d->remote_stats();
               py::dict x;
               x["hits"] = s.hits;
               x["misses"] = s.misses;
               x["downloads"] = s.downloads;
               x["bytes_downloaded"] = s.bytes_downloaded;
               x["evictions"] = s.evictions;
               x["retries"] = s.retries;
               x["wait_seconds"] = s.wait_seconds;
               out.append(x);
             }
             return out;
           })
      .def("stats",
           [](PyTokenLoader& l) {
             const stoker::TokenLoaderStats s = l.loader().Stats();
             py::dict x;
             x["batches"] = s.batches;
             x["rows"] = s.rows;
             x["tokens"] = s.tokens;
             x["wait_s"] = s.wait_seconds;
             x["build_s"] = s.build_seconds;
             x["batches_built"] = s.batches_built;
             return x;
           })
      .def_property_readonly("epoch", [](PyTokenLoader& l) { return l.loader().epoch(); })
      .def_property_readonly("num_batches", [](PyTokenLoader& l) { return l.loader().num_batches(); })
      .def_property_readonly("num_rows", [](PyTokenLoader& l) { return l.loader().num_rows(); })
      .def_property_readonly("num_tokens", &PyTokenLoader::num_tokens)
      .def_property_readonly("num_documents", &PyTokenLoader::num_documents)
      .def_property_readonly("kernel_readahead", [](PyTokenLoader& l) { return l.loader().kernel_readahead(); })
      .def_property_readonly("readahead_note", [](PyTokenLoader& l) { return l.loader().readahead_note(); })
      .def("set_epoch", [](PyTokenLoader& l, std::uint64_t e) { Check(l.loader().SetEpoch(e)); })
      .def("state", [](PyTokenLoader& l) { return StateToDict(l.loader().State()); })
      .def("restore", [](PyTokenLoader& l, const py::dict& d) { Check(l.loader().Restore(StateFromDict(d))); })
      .def("reshard",
           [](PyTokenLoader& l, std::uint32_t rank, std::uint32_t world) { Check(l.loader().Reshard(rank, world)); });

  py::class_<stoker::TokenDatasetWriter>(m, "TokenDatasetWriter")
      .def(py::init([](const std::string& prefix, const std::string& token_type, bool overwrite) {
        return Unwrap(stoker::TokenDatasetWriter::Create(prefix, token_type, overwrite));
      }))
      .def("add_document",
           [](stoker::TokenDatasetWriter& w,
              py::array_t<std::int64_t, py::array::c_style | py::array::forcecast> tokens) {
             if (tokens.ndim() != 1) throw py::value_error("a document is a 1-D sequence of token ids");
             std::span<const std::int64_t> view(tokens.data(), static_cast<std::size_t>(tokens.size()));
             py::gil_scoped_release release;
             Check(w.AddDocument(view));
           })
      // Documents given as lists of ints (what tokenizers return), converted
      // here without a NumPy array per document; `eos` appended to each when
      // given. Returns the tokens added.
      .def("add_documents",
           [](stoker::TokenDatasetWriter& w, const py::list& documents, std::optional<std::int64_t> eos) {
             std::uint64_t tokens = 0;
             std::vector<std::int64_t> document;
             for (const py::handle item : documents) {
               if (!PyList_Check(item.ptr())) throw py::type_error("add_documents takes lists of token ids");
               const Py_ssize_t n = PyList_GET_SIZE(item.ptr());
               document.resize(static_cast<std::size_t>(n));
               for (Py_ssize_t i = 0; i < n; ++i) {
                 const long long v = PyLong_AsLongLong(PyList_GET_ITEM(item.ptr(), i));
                 if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
                 document[static_cast<std::size_t>(i)] = v;
               }
               if (eos) document.push_back(*eos);
               Check(w.AddDocument(document));
               tokens += document.size();
             }
             return tokens;
           })
      .def_property_readonly("num_documents", &stoker::TokenDatasetWriter::num_documents)
      .def("finish", [](stoker::TokenDatasetWriter& w) { Check(w.Finish()); });

  py::class_<stoker::SentencePieceEncoder>(m, "SentencePieceEncoder")
      .def(py::init([](const std::string& path) { return Unwrap(stoker::SentencePieceEncoder::Open(path)); }))
      .def_property_readonly("vocab_size", &stoker::SentencePieceEncoder::vocab_size)
      .def_property_readonly("eos_id", &stoker::SentencePieceEncoder::eos_id)
      .def("piece_id", &stoker::SentencePieceEncoder::PieceId)
      .def("encode_batch",
           [](const stoker::SentencePieceEncoder& e, std::vector<std::string> texts) {
             std::vector<std::string_view> views(texts.begin(), texts.end());
             py::gil_scoped_release release;
             return Unwrap(e.EncodeBatch(views));
           })
      // Encodes `texts` and adds each as a document of `writer` (with `eos`
      // appended when given), all without the GIL; returns the tokens added.
      .def("encode_into", [](const stoker::SentencePieceEncoder& e, stoker::TokenDatasetWriter& writer,
                             std::vector<std::string> texts, std::optional<std::int64_t> eos) {
        std::vector<std::string_view> views(texts.begin(), texts.end());
        py::gil_scoped_release release;
        auto encoded = Unwrap(e.EncodeBatch(views));
        std::uint64_t tokens = 0;
        std::vector<std::int64_t> document;
        for (const auto& ids : encoded) {
          document.assign(ids.begin(), ids.end());
          if (eos) document.push_back(*eos);
          Check(writer.AddDocument(document));
          tokens += document.size();
        }
        return tokens;
      });
}

}  // namespace stoker_python
