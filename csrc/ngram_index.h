// N-gram prompt lookup with exactly the output of vLLM 0.26's NgramProposer
// (vllm/v1/spec_decode/ngram_proposer.py): among the earlier occurrences of
// the sequence's suffixes of length in [min_n, max_n], take the longest; among
// equally long ones, the EARLIEST (leftmost) occurrence; draft the up to k
// tokens that follow it, k further capped by max_model_len - n.
#pragma once

#include <cstdint>

namespace specdec {

struct NgramDraft {
  int64_t start = 0;  // first draft token's index in the sequence
  int64_t len = 0;    // 0 = no draft
};

// `scratch` must hold at least min(max_n, n) ints (the KMP failure table).
NgramDraft ngram_find_draft(const int32_t* tokens, int64_t n, int32_t min_n, int32_t max_n,
                            int64_t max_model_len, int64_t k, int32_t* scratch);

}  // namespace specdec
