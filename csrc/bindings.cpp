// Python bindings for specdec_plugin._C (the only translation unit that pulls
// in torch/extension.h, which is slow to compile). Token arrays cross the
// boundary as numpy int32 arrays (lists are converted once by pybind11).
#include <torch/extension.h>

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "cpu_attention.h"
#include "cpu_layer_ops.h"
#include "cpu_linear_packed.h"
#include "cpu_work_pool.h"
#include "ngram_index.h"
#include "suffix_tree.h"

namespace py = pybind11;
using specdec::Draft;
using specdec::SuffixIndex;

namespace {

using TokenArray = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

const int32_t* data_of(const TokenArray& a) { return a.ndim() == 0 ? nullptr : a.data(); }

size_t size_of(const TokenArray& a) {
  if (a.ndim() != 1) throw py::value_error("token array must be 1-D");
  return static_cast<size_t>(a.shape(0));
}

py::tuple draft_to_tuple(const Draft& d) {
  py::list tokens(d.token_ids.size()), probs(d.probs.size());
  for (size_t i = 0; i < d.token_ids.size(); ++i) {
    tokens[i] = py::int_(d.token_ids[i]);
    probs[i] = py::float_(d.probs[i]);
  }
  return py::make_tuple(tokens, probs, d.match_len, d.score);
}

void require_active(const SuffixIndex& index, const std::string& req_id) {
  if (!index.has_request(req_id)) throw py::key_error("unknown request id: " + req_id);
}

// One draft per listed row of a [rows, max_model_len] int32 token buffer.
py::list ngram_propose_batch(const py::array_t<int32_t>& token_ids,
                             const py::array_t<int64_t, py::array::forcecast>& num_tokens,
                             const std::vector<int64_t>& rows, int32_t min_n, int32_t max_n,
                             int64_t k, int64_t max_model_len) {
  if (token_ids.ndim() != 2) throw py::value_error("token_ids must be 2-D");
  if (num_tokens.ndim() != 1) throw py::value_error("num_tokens must be 1-D");
  const int64_t num_rows = token_ids.shape(0), row_len = token_ids.shape(1);
  const int64_t row_stride = token_ids.strides(0) / static_cast<int64_t>(sizeof(int32_t));
  const bool contiguous_rows = token_ids.strides(1) == static_cast<py::ssize_t>(sizeof(int32_t));
  auto counts = num_tokens.unchecked<1>();
  for (int64_t r : rows) {
    if (r < 0 || r >= num_rows || r >= counts.shape(0)) throw py::index_error("row out of range");
    if (counts(r) < 0 || counts(r) > row_len) throw py::value_error("num_tokens out of range");
  }

  const int32_t* base = token_ids.data();
  std::vector<specdec::NgramDraft> drafts(rows.size());
  std::vector<const int32_t*> row_ptr(rows.size());
  std::vector<std::vector<int32_t>> copies;  // only for non-contiguous rows
  if (!contiguous_rows) {
    auto view = token_ids.unchecked<2>();
    copies.resize(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      copies[i].resize(static_cast<size_t>(counts(rows[i])));
      for (int64_t j = 0; j < counts(rows[i]); ++j) copies[i][j] = view(rows[i], j);
      row_ptr[i] = copies[i].data();
    }
  } else {
    for (size_t i = 0; i < rows.size(); ++i) row_ptr[i] = base + rows[i] * row_stride;
  }
  {
    py::gil_scoped_release no_gil;
    std::vector<int32_t> fail(static_cast<size_t>(std::max(max_n, 1)));
    for (size_t i = 0; i < rows.size(); ++i)
      drafts[i] = specdec::ngram_find_draft(row_ptr[i], counts(rows[i]), min_n, max_n,
                                            max_model_len, k, fail.data());
  }
  py::list out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    py::list draft(static_cast<size_t>(drafts[i].len));
    for (int64_t j = 0; j < drafts[i].len; ++j) draft[j] = py::int_(row_ptr[i][drafts[i].start + j]);
    out[i] = draft;
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "specdec_plugin host-side C++ helpers (suffix decoding, n-gram lookup, CPU attention)";

  py::class_<SuffixIndex::PreparedRequest, std::shared_ptr<SuffixIndex::PreparedRequest>>(
      m, "PreparedSuffixRequest");

  py::class_<SuffixIndex>(m, "SuffixIndex")
      .def(py::init<int32_t, int32_t>(), py::arg("max_tree_depth"), py::arg("max_cached_requests"))
      .def("start_request",
           [](SuffixIndex& s, const std::string& id, const TokenArray& prompt) {
             s.start_request(id, data_of(prompt), size_of(prompt));
           })
      .def("add_tokens",
           [](SuffixIndex& s, const std::string& id, const TokenArray& tokens) {
             require_active(s, id);
             s.add_tokens(id, data_of(tokens), size_of(tokens));
           })
      // One call for a step's rows (each request's new tokens): every id is checked first, so
      // an unknown one raises before any trie changes; then the tries grow without the GIL,
      // beside the engine's other Python thread (a per-row call held it for each row).
      .def("add_tokens_batch",
           [](SuffixIndex& s, const std::vector<std::string>& ids,
              const std::vector<std::vector<int32_t>>& tokens) {
             if (ids.size() != tokens.size())
               throw py::value_error("req_ids and tokens differ in length");
             for (const std::string& id : ids) require_active(s, id);
             py::gil_scoped_release no_gil;
             for (size_t i = 0; i < ids.size(); ++i)
               s.add_tokens(ids[i], tokens[i].data(), tokens[i].size());
           },
           py::arg("req_ids"), py::arg("tokens"))
      .def("prepare_requests",
           [](const SuffixIndex& s, const std::vector<std::vector<int32_t>>& prompts,
              const std::vector<std::vector<int32_t>>& outputs, size_t threads) {
             py::gil_scoped_release no_gil;  // the tries are built apart from every index
             return s.prepare_requests(prompts, outputs, threads);
           },
           py::arg("prompts"), py::arg("outputs"), py::arg("threads"))
      .def("start_prepared", &SuffixIndex::start_prepared, py::arg("req_id"),
           py::arg("prepared"))
      .def("stop_request",
           [](SuffixIndex& s, const std::string& id) {
             require_active(s, id);
             s.stop_request(id);
           })
      .def("evict_cached", &SuffixIndex::evict_cached)
      .def(
          "speculate",
          [](SuffixIndex& s, const std::string& id, const py::object& context, int32_t max_spec_tokens,
             double max_spec_factor, double min_token_prob) {
            require_active(s, id);
            if (context.is_none())
              return draft_to_tuple(
                  s.speculate(id, nullptr, 0, max_spec_tokens, max_spec_factor, min_token_prob));
            TokenArray ctx = TokenArray::ensure(context);
            if (!ctx) throw py::type_error("context must be convertible to an int32 array");
            return draft_to_tuple(s.speculate(id, data_of(ctx), size_of(ctx), max_spec_tokens,
                                              max_spec_factor, min_token_prob));
          },
          py::arg("req_id"), py::arg("context"), py::arg("max_spec_tokens"),
          py::arg("max_spec_factor"), py::arg("min_token_prob"))
      .def(
          "speculate_batch",
          [](SuffixIndex& s, const std::vector<std::string>& ids,
             const std::vector<int32_t>& max_spec_tokens, double max_spec_factor,
             double min_token_prob) {
            if (ids.size() != max_spec_tokens.size())
              throw py::value_error("req_ids and max_spec_tokens differ in length");
            py::list out(ids.size());
            for (size_t i = 0; i < ids.size(); ++i) {
              require_active(s, ids[i]);
              Draft d = s.speculate(ids[i], nullptr, 0, max_spec_tokens[i], max_spec_factor,
                                    min_token_prob);
              out[i] = py::cast(d.token_ids);
            }
            return out;
          },
          py::arg("req_ids"), py::arg("max_spec_tokens"), py::arg("max_spec_factor"),
          py::arg("min_token_prob"))
      .def("has_request", &SuffixIndex::has_request)
      .def("has_cached", &SuffixIndex::has_cached)
      .def("num_active_requests", &SuffixIndex::num_active_requests)
      .def("num_cached_requests", &SuffixIndex::num_cached_requests)
      .def("active_request_ids", &SuffixIndex::active_request_ids)
      .def("cached_request_ids", &SuffixIndex::cached_request_ids)
      .def("global_num_nodes", &SuffixIndex::global_num_nodes)
      .def("check_invariants", &SuffixIndex::check_invariants)
      .def_property_readonly("max_tree_depth", &SuffixIndex::max_tree_depth)
      .def_property_readonly("max_cached_requests", &SuffixIndex::max_cached_requests);

  m.def("ngram_propose_batch", &ngram_propose_batch, py::arg("token_ids").noconvert(), py::arg("num_tokens"),
        py::arg("rows"), py::arg("min_n"), py::arg("max_n"), py::arg("k"),
        py::arg("max_model_len"));

  // The CPU attention layer (ops/paged_attention/cpp.py, ops/reshape_and_cache/cpp.py). The GIL
  // is released: the kernels touch no Python state.
  m.def("cpu_paged_attention", &specdec::cpu_paged_attention, py::arg("query"), py::arg("key_cache"),
        py::arg("value_cache"), py::arg("block_table"), py::arg("query_start_loc"),
        py::arg("seq_lens"), py::arg("scale"), py::arg("out"), py::arg("vectorized") = true,
        py::call_guard<py::gil_scoped_release>());
  m.def("cpu_reshape_and_cache", &specdec::cpu_reshape_and_cache, py::arg("key"), py::arg("value"),
        py::arg("key_cache"), py::arg("value_cache"), py::arg("slot_mapping"),
        py::call_guard<py::gil_scoped_release>());

  // CPU linear layers on bfloat16 (or float32) weights packed by ops/linear/cpp.py.
  m.def("cpu_linear_packed", &specdec::cpu_linear_packed, py::arg("x"), py::arg("packed"),
        py::arg("out_features"), py::arg("bias") = py::none(), py::arg("portable") = false,
        py::call_guard<py::gil_scoped_release>());
  m.def("cpu_linear_packed_vectorized", &specdec::cpu_linear_packed_vectorized);
  // The linear layers' helper threads (csrc/cpu_work_pool.cpp): threads in all, spin time.
  m.def("cpu_pool_configure", &specdec::pool_configure, py::arg("threads"), py::arg("spin_us"));
  m.def("cpu_pool_spin_us", &specdec::pool_spin_us);

  // RMSNorm, rotary and SiLU-and-mul of a CPU decoder layer (ops/{rms_norm,rotary,activation}/cpp.py).
  m.def("cpu_rms_norm", &specdec::cpu_rms_norm, py::arg("x"), py::arg("weight"), py::arg("eps"),
        py::arg("residual"), py::arg("out"), py::arg("residual_out"),
        py::call_guard<py::gil_scoped_release>());
  m.def("cpu_rotary", &specdec::cpu_rotary, py::arg("positions"), py::arg("query"), py::arg("key"),
        py::arg("cos_sin_cache"), py::arg("head_size"), py::arg("rotary_dim"), py::arg("is_neox"),
        py::call_guard<py::gil_scoped_release>());
  m.def("cpu_silu_and_mul", &specdec::cpu_silu_and_mul, py::arg("x"),
        py::call_guard<py::gil_scoped_release>());
}
