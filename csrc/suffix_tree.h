// Host-side index for SuffixDecoding (arXiv 2411.04975): frequency-counted,
// depth-capped suffix tries over token streams, one per live request plus one
// global trie over finished requests, and greedy chain speculation from them.
//
// Semantics (mirrored exactly by specdec_plugin/spec_decode/suffix_reference.py):
//  * A trie of depth D counts, for every position of every inserted stream,
//    each substring of length <= D that starts there. A node's `count` is the
//    number of occurrences of its string; `child_total` is the number of those
//    occurrences that have a following token inside the depth cap.
//  * The anchor for a token string S is the longest suffix of S whose node has
//    at least one continuation (child_total > 0). match_len = its length.
//  * Speculation walks from the anchor: pick the child with the largest count
//    (ties: smallest token id), p = child.count / node.child_total, cumulative
//    prob *= p, stop before a token whose cumulative prob < min_token_prob.
//    After each step the anchor is recomputed for S + draft (follow suffix
//    links while the node has no continuation), so a match that reaches the
//    depth cap keeps drafting from its shorter suffixes instead of stopping.
//  * Draft length <= min(max_spec_tokens, floor(max_spec_factor * match_len)).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace specdec {

struct Draft {
  std::vector<int32_t> token_ids;
  std::vector<double> probs;  // cumulative probability after each token
  int32_t match_len = 0;
  double score = 0.0;         // sum of `probs`
};

class SuffixTrie {
 public:
  explicit SuffixTrie(int32_t max_depth);

  // Node ids of the current stream's suffixes of length 0..min(len, D-1);
  // index = suffix length. Start a stream with `start_stream()`.
  using Cursor = std::vector<int32_t>;
  Cursor start_stream() const { return Cursor{kRoot}; }

  // Counts every substring (length <= D) that ends with `token`. O(D).
  void extend(Cursor& cursor, int32_t token);
  void insert_sequence(const int32_t* tokens, size_t n);
  // Exact inverse of insert_sequence on the same tokens; frees dead nodes.
  void remove_sequence(const int32_t* tokens, size_t n);

  Draft speculate(const int32_t* context, size_t n, int32_t max_spec_tokens,
                  double max_spec_factor, double min_token_prob);

  int32_t max_depth() const { return max_depth_; }
  size_t num_nodes() const { return nodes_.size() - free_.size(); }
  // Recounts everything from scratch; returns "" when consistent.
  std::string check_invariants() const;

 private:
  static constexpr int32_t kRoot = 0;
  struct Edge {
    int32_t token;
    int32_t node;
  };
  struct Node {
    int32_t token = -1;
    int32_t count = 0;
    int32_t child_total = 0;
    int32_t link = -1;  // node of this string minus its first token
    int32_t best = -1;  // most frequent child; -1 = recompute on demand
    // Most nodes (deep, unique continuations) have one child: keep it inline so
    // that they need no heap block and lookups no extra pointer chase.
    Edge first{-1, -1};        // node == -1: no children
    std::vector<Edge> more;    // the other children, sorted by token
    template <class F>
    void for_each_child(F&& f) const {
      if (first.node >= 0) f(first);
      for (const Edge& e : more) f(e);
    }
  };

  static bool edge_before(const Edge& e, int32_t token);
  int32_t find_child(int32_t node, int32_t token) const;
  void erase_child(int32_t node, int32_t token);
  int32_t get_or_add_child(int32_t node, int32_t token, int32_t link);
  int32_t best_child(int32_t node);
  int32_t alloc_node();
  void free_subtree(int32_t node);

  int32_t max_depth_;
  std::vector<Node> nodes_;
  std::vector<int32_t> free_;
  Cursor scratch_;
};

// Per-request local tries plus a FIFO-capped global trie of finished requests
// (implemented in suffix_index.cpp).
class SuffixIndex {
  struct ActiveRequest;

 public:
  SuffixIndex(int32_t max_tree_depth, int32_t max_cached_requests);

  void start_request(const std::string& req_id, const int32_t* prompt, size_t n);

  // A request's local trie built apart from the index, from its prompt and the output it
  // already has (as start_request + add_tokens): several are built at once, on several
  // threads, then started in order with start_prepared (suffix_lazy.py: a batch of new
  // requests cost the engine's thread about 15 ms at batch 64 on an H200 host).
  struct PreparedRequest {
    std::unique_ptr<ActiveRequest> req;  // null once started
  };
  // out[i] from prompts[i] followed by outputs[i], on at most `threads` threads and one per
  // 1,024 tokens (threads <= 1: on the calling thread).
  // Reads only the index's depth, so it may run while nothing else uses the index.
  std::vector<std::shared_ptr<PreparedRequest>> prepare_requests(
      const std::vector<std::vector<int32_t>>& prompts,
      const std::vector<std::vector<int32_t>>& outputs, size_t threads) const;
  void start_prepared(const std::string& req_id, PreparedRequest& prepared);
  void add_tokens(const std::string& req_id, const int32_t* tokens, size_t n);
  // Moves the request's prompt tail + response into the global trie.
  void stop_request(const std::string& req_id);
  // Drops a finished request's response from the global trie (no-op if absent).
  void evict_cached(const std::string& req_id);

  // context == nullptr: use the request's own last max_tree_depth tokens.
  Draft speculate(const std::string& req_id, const int32_t* context, size_t n,
                  int32_t max_spec_tokens, double max_spec_factor,
                  double min_token_prob);

  bool has_request(const std::string& req_id) const;
  bool has_cached(const std::string& req_id) const;
  size_t num_active_requests() const { return active_.size(); }
  size_t num_cached_requests() const { return cached_.size(); }
  std::vector<std::string> active_request_ids() const;
  std::vector<std::string> cached_request_ids() const;
  size_t global_num_nodes() const { return global_.num_nodes(); }
  std::string check_invariants() const;

  int32_t max_tree_depth() const { return max_tree_depth_; }
  int32_t max_cached_requests() const { return max_cached_requests_; }

 private:
  struct ActiveRequest {
    explicit ActiveRequest(int32_t depth) : local(depth) {}
    SuffixTrie local;
    SuffixTrie::Cursor cursor;
    std::vector<int32_t> tokens;  // prompt + response
    size_t prompt_len = 0;
  };
  struct CachedRequest {
    std::string req_id;
    std::vector<int32_t> tokens;  // exactly what went into the global trie
  };

  ActiveRequest& active(const std::string& req_id);
  // A request's trie over prompt then output (start_request's and prepare_requests' one
  // way of building it); reads only the depth.
  std::unique_ptr<ActiveRequest> new_request(const int32_t* prompt, size_t n,
                                             const int32_t* output, size_t m) const;

  int32_t max_tree_depth_;
  int32_t max_cached_requests_;
  SuffixTrie global_;
  std::unordered_map<std::string, std::unique_ptr<ActiveRequest>> active_;
  std::list<CachedRequest> cached_;  // oldest first
  std::unordered_map<std::string, std::list<CachedRequest>::iterator> cached_by_id_;
};

}  // namespace specdec
