// Request bookkeeping around SuffixTrie: one local trie per live request
// (prompt + generated tokens) and a global trie of finished requests, capped
// FIFO at max_cached_requests whole requests.
//
// The global trie stores each finished response preceded by the last D-1
// prompt tokens: those lead-in tokens let a later request with the same
// prompt tail be continued from its very first decode step, while every
// counted substring still ends inside [lead-in + response].
#include <algorithm>
#include <atomic>
#include <exception>
#include <stdexcept>
#include <thread>

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

std::unique_ptr<SuffixIndex::ActiveRequest> SuffixIndex::new_request(
    const int32_t* prompt, size_t n, const int32_t* output, size_t m) const {
  auto req = std::make_unique<ActiveRequest>(max_tree_depth_);
  req->cursor = req->local.start_stream();
  req->tokens.reserve(n + m);
  req->tokens.assign(prompt, prompt + n);
  req->tokens.insert(req->tokens.end(), output, output + m);
  req->prompt_len = n;
  for (int32_t token : req->tokens) req->local.extend(req->cursor, token);
  return req;
}

void SuffixIndex::start_request(const std::string& req_id, const int32_t* prompt, size_t n) {
  if (active_.count(req_id)) throw std::invalid_argument("request already active: " + req_id);
  active_.emplace(req_id, new_request(prompt, n, nullptr, 0));
}

std::vector<std::shared_ptr<SuffixIndex::PreparedRequest>> SuffixIndex::prepare_requests(
    const std::vector<std::vector<int32_t>>& prompts,
    const std::vector<std::vector<int32_t>>& outputs, size_t threads) const {
  if (prompts.size() != outputs.size())
    throw std::invalid_argument("prompts and outputs differ in length");
  const size_t n = prompts.size();
  std::vector<std::shared_ptr<PreparedRequest>> out(n);
  std::vector<std::exception_ptr> errors(n);
  auto build = [&](size_t i) {
    try {
      out[i] = std::make_shared<PreparedRequest>();
      out[i]->req = new_request(prompts[i].data(), prompts[i].size(), outputs[i].data(),
                                outputs[i].size());
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  // A thread only where it gets about 1,024 tokens to index (about 0.5 ms of work at the
  // 0.55 us a token measured on a 2-core CPU, depth 24), far above what starting one costs.
  size_t total_tokens = 0;
  for (size_t i = 0; i < n; ++i) total_tokens += prompts[i].size() + outputs[i].size();
  threads = std::min({threads, n, 1 + total_tokens / 1024});
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) build(i);
  } else {
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i = next++; i < n; i = next++) build(i);
    };
    std::vector<std::thread> helpers;
    helpers.reserve(threads - 1);
    for (size_t t = 1; t < threads; ++t) helpers.emplace_back(work);
    work();
    for (std::thread& helper : helpers) helper.join();
  }
  for (const std::exception_ptr& error : errors)
    if (error) std::rethrow_exception(error);
  return out;
}

void SuffixIndex::start_prepared(const std::string& req_id, PreparedRequest& prepared) {
  if (!prepared.req) throw std::invalid_argument("prepared request already started");
  if (prepared.req->local.max_depth() != max_tree_depth_)
    throw std::invalid_argument("prepared for an index of another depth");
  if (active_.count(req_id)) throw std::invalid_argument("request already active: " + req_id);
  active_.emplace(req_id, std::move(prepared.req));
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
