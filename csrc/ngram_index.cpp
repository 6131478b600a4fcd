// Linear-time n-gram prompt lookup, see ngram_index.h for the contract.
//
// Reading the sequence backwards, r[x] = tokens[n-1-x], an earlier occurrence
// of the last l tokens that starts at index s is a copy of r[0..l) ending at
// r-position j = n-1-s (j >= 1 keeps it strictly before the suffix itself).
// KMP over r with the pattern r[0..P), P = min(max_n, n), yields for every j
// the longest such l <= max_n; the earliest occurrence is the largest j.
#include "ngram_index.h"

#include <algorithm>

namespace specdec {

NgramDraft ngram_find_draft(const int32_t* tokens, int64_t n, int32_t min_n, int32_t max_n,
                            int64_t max_model_len, int64_t k, int32_t* fail) {
  NgramDraft out;
  if (n <= 0 || n < min_n || max_n <= 0) return out;
  k = std::min(k, max_model_len - n);
  if (k <= 0) return out;
  const int32_t* last = tokens + (n - 1);  // r[x] == last[-x]
  const int64_t pattern_len = std::min<int64_t>(max_n, n);

  fail[0] = 0;
  for (int64_t i = 1; i < pattern_len; ++i) {
    int32_t q = fail[i - 1];
    while (q > 0 && last[-i] != last[-q]) q = fail[q - 1];
    if (last[-i] == last[-q]) ++q;
    fail[i] = q;
  }

  int64_t best_len = 0, best_j = 0;
  int32_t q = 0;
  for (int64_t j = 1; j < n; ++j) {
    const int32_t t = last[-j];
    // A full-length match cannot grow: fall back before comparing.
    while (q > 0 && (q == pattern_len || last[-q] != t)) q = fail[q - 1];
    if (last[-q] == t) ++q;
    if (q > 0 && q >= best_len) {
      best_len = q;
      best_j = j;
    }
  }
  if (best_len < min_n) return out;
  out.start = n - 1 - best_j + best_len;
  out.len = std::min(k, n - out.start);
  if (out.len < 0) out.len = 0;
  return out;
}

}  // namespace specdec
