// Depth-capped, frequency-counted suffix trie with suffix links; see
// suffix_tree.h for the exact semantics.
//
// Why suffix links: they make "longest suffix of the context present in the
// trie" an amortised O(len) scan and let speculation fall back to a shorter
// suffix in O(1) when a match runs into the depth cap. They stay valid under
// removal because count(aX) <= count(X): when remove_sequence walks starts in
// increasing order, every node that links to X reaches zero (and is freed)
// before X does.
#include "suffix_tree.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace specdec {

SuffixTrie::SuffixTrie(int32_t max_depth) : max_depth_(max_depth) {
  if (max_depth < 1) throw std::invalid_argument("max_depth must be >= 1");
  nodes_.emplace_back();  // root
}

int32_t SuffixTrie::alloc_node() {
  if (!free_.empty()) {
    int32_t id = free_.back();
    free_.pop_back();
    return id;
  }
  nodes_.emplace_back();
  return static_cast<int32_t>(nodes_.size() - 1);
}

void SuffixTrie::free_subtree(int32_t root) {
  std::vector<int32_t> stack{root};
  while (!stack.empty()) {
    int32_t id = stack.back();
    stack.pop_back();
    Node& n = nodes_[id];
    n.for_each_child([&](const Edge& e) { stack.push_back(e.node); });
    n = Node();  // also releases `more`
    free_.push_back(id);
  }
}

bool SuffixTrie::edge_before(const Edge& e, int32_t t) { return e.token < t; }

int32_t SuffixTrie::find_child(int32_t node, int32_t token) const {
  const Node& n = nodes_[node];
  if (n.first.token == token && n.first.node >= 0) return n.first.node;
  auto it = std::lower_bound(n.more.begin(), n.more.end(), token, edge_before);
  return (it != n.more.end() && it->token == token) ? it->node : -1;
}

void SuffixTrie::erase_child(int32_t node, int32_t token) {
  Node& n = nodes_[node];
  if (n.first.token == token && n.first.node >= 0) {
    if (n.more.empty()) {
      n.first = Edge{-1, -1};
    } else {  // popping the back keeps `more` sorted
      n.first = n.more.back();
      n.more.pop_back();
    }
    return;
  }
  auto it = std::lower_bound(n.more.begin(), n.more.end(), token, edge_before);
  n.more.erase(it);
}

int32_t SuffixTrie::get_or_add_child(int32_t node, int32_t token, int32_t link) {
  const int32_t existing = find_child(node, token);
  if (existing >= 0) return existing;
  int32_t child = alloc_node();  // may reallocate nodes_: no references held
  nodes_[child].token = token;
  nodes_[child].link = link;
  Node& n = nodes_[node];
  if (n.first.node < 0) {
    n.first = Edge{token, child};
  } else {
    auto it = std::lower_bound(n.more.begin(), n.more.end(), token, edge_before);
    n.more.insert(it, Edge{token, child});
  }
  return child;
}

int32_t SuffixTrie::best_child(int32_t node) {
  Node& n = nodes_[node];
  if (n.best < 0 && n.child_total > 0) {
    int32_t best = -1, best_count = 0, best_token = 0;
    n.for_each_child([&](const Edge& e) {
      const int32_t c = nodes_[e.node].count;
      if (c > best_count || (c == best_count && e.token < best_token)) {
        best = e.node;
        best_count = c;
        best_token = e.token;
      }
    });
    n.best = best;
  }
  return n.best;
}

void SuffixTrie::extend(Cursor& cursor, int32_t token) {
  scratch_.clear();
  scratch_.push_back(kRoot);
  int32_t shorter = kRoot;  // node of the new suffix one token shorter
  for (size_t d = 0; d < cursor.size(); ++d) {
    const int32_t parent = cursor[d];
    const int32_t child = get_or_add_child(parent, token, shorter);
    Node& c = nodes_[child];
    Node& p = nodes_[parent];
    c.count += 1;
    if (p.child_total == 0) {
      p.best = child;
    } else if (p.best >= 0 && p.best != child) {
      const Node& b = nodes_[p.best];
      if (c.count > b.count || (c.count == b.count && c.token < b.token)) p.best = child;
    }
    p.child_total += 1;
    if (static_cast<int32_t>(d) + 1 < max_depth_) scratch_.push_back(child);
    shorter = child;
  }
  cursor.swap(scratch_);
}

void SuffixTrie::insert_sequence(const int32_t* tokens, size_t n) {
  Cursor cursor = start_stream();
  for (size_t i = 0; i < n; ++i) extend(cursor, tokens[i]);
}

void SuffixTrie::remove_sequence(const int32_t* tokens, size_t n) {
  for (size_t s = 0; s < n; ++s) {
    int32_t node = kRoot;
    const size_t depth = std::min(static_cast<size_t>(max_depth_), n - s);
    for (size_t d = 0; d < depth; ++d) {
      const int32_t child = find_child(node, tokens[s + d]);
      if (child < 0) throw std::logic_error("remove_sequence: sequence was not inserted");
      Node& p = nodes_[node];
      p.child_total -= 1;
      if (p.best == child) p.best = -1;
      if (--nodes_[child].count == 0) {
        erase_child(node, tokens[s + d]);
        // Deeper nodes on this path only occur where this one does: all dead now.
        free_subtree(child);
        break;
      }
      node = child;
    }
  }
}

Draft SuffixTrie::speculate(const int32_t* context, size_t n, int32_t max_spec_tokens,
                            double max_spec_factor, double min_token_prob) {
  Draft draft;
  // Longest suffix of the context present in the trie (matching statistics).
  // Only the last D tokens can take part in a match of length <= D.
  int32_t node = kRoot, depth = 0;
  for (size_t i = n > static_cast<size_t>(max_depth_) ? n - max_depth_ : 0; i < n; ++i) {
    for (;;) {
      const int32_t c = find_child(node, context[i]);
      if (c >= 0) {
        node = c;
        ++depth;
        break;
      }
      if (node == kRoot) break;
      node = nodes_[node].link;
      --depth;
    }
  }
  while (node != kRoot && nodes_[node].child_total == 0) {
    node = nodes_[node].link;
    --depth;
  }
  if (node == kRoot) return draft;
  draft.match_len = depth;

  // The epsilon keeps e.g. 0.3 * 10 from flooring to 2.
  const double scaled = std::floor(max_spec_factor * depth + 1e-9);
  const int32_t limit = static_cast<int32_t>(
      std::min(static_cast<double>(max_spec_tokens), scaled));
  double cum = 1.0;
  while (static_cast<int32_t>(draft.token_ids.size()) < limit) {
    const int32_t child = best_child(node);
    const double p = static_cast<double>(nodes_[child].count) /
                     static_cast<double>(nodes_[node].child_total);
    const double next = cum * p;
    if (next < min_token_prob) break;
    cum = next;
    draft.token_ids.push_back(nodes_[child].token);
    draft.probs.push_back(cum);
    draft.score += cum;
    node = child;
    while (node != kRoot && nodes_[node].child_total == 0) node = nodes_[node].link;
    if (node == kRoot) break;
  }
  return draft;
}

std::string SuffixTrie::check_invariants() const {
  std::ostringstream err;
  // DFS from the root, remembering each node's string to verify suffix links.
  std::vector<std::vector<int32_t>> path_of(nodes_.size());
  std::vector<char> seen(nodes_.size(), 0);
  std::vector<int32_t> stack{kRoot};
  seen[kRoot] = 1;
  size_t reached = 0;
  while (!stack.empty()) {
    const int32_t id = stack.back();
    stack.pop_back();
    ++reached;
    const Node& nd = nodes_[id];
    int64_t total = 0;
    int32_t best = -1, best_count = 0, best_token = 0;
    for (size_t i = 1; i < nd.more.size(); ++i)
      if (nd.more[i - 1].token >= nd.more[i].token) err << "children not sorted at " << id << "; ";
    if (nd.first.node < 0 && !nd.more.empty()) err << "empty inline child at " << id << "; ";
    if (nd.first.node >= 0 && find_child(id, nd.first.token) != nd.first.node)
      err << "duplicate child token at " << id << "; ";
    nd.for_each_child([&](const Edge& e) {
      const Node& c = nodes_[e.node];
      if (c.token != e.token) err << "edge token mismatch at " << e.node << "; ";
      if (c.count <= 0) err << "dead child " << e.node << "; ";
      if (id != kRoot && c.count > nd.count) err << "child count > parent at " << e.node << "; ";
      total += c.count;
      if (c.count > best_count || (c.count == best_count && e.token < best_token))
        best = e.node, best_count = c.count, best_token = e.token;
      if (seen[e.node]) err << "node reached twice " << e.node << "; ";
      seen[e.node] = 1;
      path_of[e.node] = path_of[id];
      path_of[e.node].push_back(e.token);
      if (static_cast<int32_t>(path_of[e.node].size()) > max_depth_) err << "too deep; ";
      stack.push_back(e.node);
    });
    if (total != nd.child_total) err << "child_total mismatch at " << id << "; ";
    if (nd.best >= 0 && nd.best != best) err << "stale best child at " << id << "; ";
  }
  if (reached + free_.size() != nodes_.size()) err << "leaked nodes; ";
  for (size_t id = 1; id < nodes_.size(); ++id) {
    if (!seen[id]) continue;
    const Node& nd = nodes_[id];
    if (nd.link < 0 || !seen[nd.link]) {
      err << "dangling link at " << id << "; ";
      continue;
    }
    const std::vector<int32_t>& s = path_of[id];
    if (!std::equal(s.begin() + 1, s.end(), path_of[nd.link].begin(), path_of[nd.link].end()))
      err << "wrong link at " << id << "; ";
    else if (nd.link != kRoot && nodes_[nd.link].count < nd.count)
      err << "count above its suffix at " << id << "; ";
  }
  return err.str();
}

}  // namespace specdec
