// Request bookkeeping around SuffixTrie: one local trie per live request
// (prompt + generated tokens) and a global trie of finished requests, capped
// FIFO at max_cached_requests whole requests.
//
// The global trie stores each finished response preceded by the last D-1
// prompt tokens: those lead-in tokens let a later request with the same
// prompt tail be continued from its very first decode step, while every
// counted substring still ends inside [lead-in + response].
#include <algorithm>
#include <stdexcept>

#include "suffix_tree.h"

namespace specdec {

SuffixIndex::SuffixIndex(int32_t max_tree_depth, int32_t max_cached_requests)
    : max_tree_depth_(max_tree_depth),
      max_cached_requests_(max_cached_requests),
      global_(max_tree_depth) {
  if (max_cached_requests < 0) throw std::invalid_argument("max_cached_requests must be >= 0");
}

SuffixIndex::ActiveRequest& SuffixIndex::active(const std::string& req_id) {
  auto it = active_.find(req_id);
  if (it == active_.end()) throw std::out_of_range("unknown request id: " + req_id);
  return *it->second;
}

void SuffixIndex::start_request(const std::string& req_id, const int32_t* prompt, size_t n) {
  if (active_.count(req_id)) throw std::invalid_argument("request already active: " + req_id);
  auto req = std::make_unique<ActiveRequest>(max_tree_depth_);
  req->cursor = req->local.start_stream();
  req->tokens.assign(prompt, prompt + n);
  req->prompt_len = n;
  for (size_t i = 0; i < n; ++i) req->local.extend(req->cursor, prompt[i]);
  active_.emplace(req_id, std::move(req));
}

void SuffixIndex::add_tokens(const std::string& req_id, const int32_t* tokens, size_t n) {
  ActiveRequest& req = active(req_id);
  req.tokens.insert(req.tokens.end(), tokens, tokens + n);
  for (size_t i = 0; i < n; ++i) req.local.extend(req.cursor, tokens[i]);
}

void SuffixIndex::stop_request(const std::string& req_id) {
  auto it = active_.find(req_id);
  if (it == active_.end()) throw std::out_of_range("unknown request id: " + req_id);
  std::unique_ptr<ActiveRequest> req = std::move(it->second);
  active_.erase(it);
  const size_t response_len = req->tokens.size() - req->prompt_len;
  if (max_cached_requests_ == 0 || response_len == 0) return;

  evict_cached(req_id);  // a reused id replaces its older entry
  const size_t lead_in = std::min(req->prompt_len, static_cast<size_t>(max_tree_depth_ - 1));
  CachedRequest entry;
  entry.req_id = req_id;
  entry.tokens.assign(req->tokens.begin() + static_cast<std::ptrdiff_t>(req->prompt_len - lead_in),
                      req->tokens.end());
  req.reset();  // free the local trie before growing the global one
  global_.insert_sequence(entry.tokens.data(), entry.tokens.size());
  cached_.push_back(std::move(entry));
  cached_by_id_[req_id] = std::prev(cached_.end());
  while (cached_.size() > static_cast<size_t>(max_cached_requests_)) {
    const CachedRequest& oldest = cached_.front();
    global_.remove_sequence(oldest.tokens.data(), oldest.tokens.size());
    cached_by_id_.erase(oldest.req_id);
    cached_.pop_front();
  }
}

void SuffixIndex::evict_cached(const std::string& req_id) {
  auto it = cached_by_id_.find(req_id);
  if (it == cached_by_id_.end()) return;
  global_.remove_sequence(it->second->tokens.data(), it->second->tokens.size());
  cached_.erase(it->second);
  cached_by_id_.erase(it);
}

Draft SuffixIndex::speculate(const std::string& req_id, const int32_t* context, size_t n,
                             int32_t max_spec_tokens, double max_spec_factor,
                             double min_token_prob) {
  ActiveRequest& req = active(req_id);
  if (context == nullptr) {
    const size_t keep = std::min(req.tokens.size(), static_cast<size_t>(max_tree_depth_));
    context = req.tokens.data() + (req.tokens.size() - keep);
    n = keep;
  }
  Draft best = req.local.speculate(context, n, max_spec_tokens, max_spec_factor, min_token_prob);
  if (max_cached_requests_ > 0 && !cached_.empty()) {
    Draft global = global_.speculate(context, n, max_spec_tokens, max_spec_factor, min_token_prob);
    if (global.score > best.score) best = std::move(global);  // ties keep the local draft
  }
  return best;
}

bool SuffixIndex::has_request(const std::string& req_id) const { return active_.count(req_id) > 0; }

bool SuffixIndex::has_cached(const std::string& req_id) const {
  return cached_by_id_.count(req_id) > 0;
}

std::vector<std::string> SuffixIndex::active_request_ids() const {
  std::vector<std::string> ids;
  ids.reserve(active_.size());
  for (const auto& kv : active_) ids.push_back(kv.first);
  return ids;
}

std::vector<std::string> SuffixIndex::cached_request_ids() const {
  std::vector<std::string> ids;
  ids.reserve(cached_.size());
  for (const CachedRequest& c : cached_) ids.push_back(c.req_id);
  return ids;
}

std::string SuffixIndex::check_invariants() const {
  std::string err = global_.check_invariants();
  if (!err.empty()) return "global: " + err;
  for (const auto& kv : active_) {
    err = kv.second->local.check_invariants();
    if (!err.empty()) return "local " + kv.first + ": " + err;
  }
  return "";
}

}  // namespace specdec
