#include "runtime/grammar/token_mask.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pagedserve::grammar {

absl::StatusOr<std::shared_ptr<const TokenVocabulary>> TokenVocabulary::Create(
    std::vector<std::string> token_bytes, std::vector<int32_t> end_ids) {
  for (int32_t id : end_ids) {
    if (id < 0 || static_cast<size_t>(id) >= token_bytes.size()) {
      return absl::InvalidArgumentError(absl::StrCat("end id ", id, " outside the vocabulary"));
    }
  }
  auto v = std::shared_ptr<TokenVocabulary>(new TokenVocabulary());
  v->token_bytes_ = std::move(token_bytes);
  std::sort(end_ids.begin(), end_ids.end());
  end_ids.erase(std::unique(end_ids.begin(), end_ids.end()), end_ids.end());
  v->end_ids_ = std::move(end_ids);
  // Sort the non-empty tokens by bytes; build the trie in one pass (nodes in
  // DFS order, so each node's edges are contiguous once collected).
  std::vector<int32_t> order;
  for (int32_t id = 0; id < v->size(); ++id) {
    if (!v->token_bytes_[id].empty() &&
        !std::binary_search(v->end_ids_.begin(), v->end_ids_.end(), id)) {
      order.push_back(id);
    }
  }
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return v->token_bytes_[a] < v->token_bytes_[b]; });
  std::vector<std::map<uint8_t, int32_t>> children(1);
  std::vector<std::vector<int32_t>> ending(1);
  for (int32_t id : order) {
    int32_t node = 0;
    for (char ch : v->token_bytes_[id]) {
      const auto b = static_cast<uint8_t>(ch);
      auto it = children[node].find(b);
      if (it == children[node].end()) {
        const auto child = static_cast<int32_t>(children.size());
        children[node][b] = child;
        children.emplace_back();
        ending.emplace_back();
        node = child;
      } else {
        node = it->second;
      }
    }
    ending[node].push_back(id);
  }
  Trie& t = v->trie_;
  t.edge_begin.push_back(0);
  t.token_begin.push_back(0);
  for (size_t n = 0; n < children.size(); ++n) {
    for (const auto& [b, c] : children[n]) {
      t.edge_byte.push_back(b);
      t.edge_child.push_back(c);
    }
    t.edge_begin.push_back(static_cast<uint32_t>(t.edge_byte.size()));
    t.tokens.insert(t.tokens.end(), ending[n].begin(), ending[n].end());
    t.token_begin.push_back(static_cast<uint32_t>(t.tokens.size()));
  }
  return std::shared_ptr<const TokenVocabulary>(std::move(v));
}

CompiledConstraint::CompiledConstraint(std::shared_ptr<const Grammar> grammar,
                                       std::shared_ptr<const TokenVocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {}

int32_t CompiledConstraint::InternLocked(GrammarState state) {
  if (auto it = ids_.find(state.stacks); it != ids_.end()) return it->second;
  const auto id = static_cast<int32_t>(entries_.size());
  ids_.emplace(state.stacks, id);
  const ByteSet allowed = grammar_->Allowed(state);
  entries_.push_back({std::move(state), allowed, nullptr, nullptr});
  return id;
}

int32_t CompiledConstraint::NextLocked(int32_t id, uint8_t byte) {
  if (!entries_[id].next) {
    entries_[id].next = std::make_unique<std::array<int32_t, 256>>();
    entries_[id].next->fill(-2);
  }
  int32_t& slot = (*entries_[id].next)[byte];
  if (slot != -2) return slot;
  GrammarState s = grammar_->Advance(entries_[id].state, byte);
  const int32_t next = s.dead() ? -1 : InternLocked(std::move(s));
  (*entries_[id].next)[byte] = next;  // entries_ may have grown: index again
  return next;
}

void CompiledConstraint::WalkLocked(int32_t node, int32_t state, TokenMask& mask) {
  const auto& t = vocab_->trie();
  for (uint32_t i = t.token_begin[node]; i < t.token_begin[node + 1]; ++i) {
    const int32_t id = t.tokens[i];
    mask[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
  }
  const ByteSet allowed = entries_[state].allowed;
  for (uint32_t e = t.edge_begin[node]; e < t.edge_begin[node + 1]; ++e) {
    if (!allowed.test(t.edge_byte[e])) continue;
    const int32_t next = NextLocked(state, t.edge_byte[e]);
    if (next >= 0) WalkLocked(t.edge_child[e], next, mask);
  }
}

std::shared_ptr<const TokenMask> CompiledConstraint::Mask(const GrammarState& state) {
  std::lock_guard<std::mutex> lock(mu_);
  if (entries_.size() > kMaxCachedStates || masks_ > kMaxCachedMasks) {
    entries_.clear();
    ids_.clear();
    masks_ = 0;
  }
  const int32_t id = InternLocked(state);
  if (entries_[id].mask) return entries_[id].mask;
  auto mask = std::make_shared<TokenMask>((static_cast<size_t>(vocab_->size()) + 63) / 64, 0);
  bool any = false;
  if (!state.dead()) {
    // The root node holds no token (empty tokens are excluded), so the walk
    // starts at its edges.
    WalkLocked(0, id, *mask);
    any = std::any_of(mask->begin(), mask->end(), [](uint64_t w) { return w != 0; });
  }
  if (grammar_->Accepting(state) || (!any && !state.dead())) {
    for (int32_t e : vocab_->end_ids())
      (*mask)[static_cast<size_t>(e) >> 6] |= uint64_t{1} << (e & 63);
  }
  ++masks_;
  ++mask_computations_;
  entries_[id].mask = mask;
  return mask;
}

size_t CompiledConstraint::cached_states() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

size_t CompiledConstraint::mask_computations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mask_computations_;
}

bool ConstraintMatcher::Accept(int32_t token) {
  const TokenVocabulary& v = c_->vocab();
  if (token < 0 || token >= v.size()) return false;
  if (std::binary_search(v.end_ids().begin(), v.end_ids().end(), token)) {
    if (!c_->grammar().Accepting(state_)) return false;
    finished_ = true;
    return true;
  }
  if (finished_) return false;
  const std::string& bytes = v.bytes(token);
  if (bytes.empty()) return false;
  GrammarState next = c_->grammar().AdvanceAll(state_, bytes);
  if (next.dead()) return false;
  state_ = std::move(next);
  return true;
}

bool ConstraintMatcher::AcceptAll(std::span<const int32_t> tokens) {
  return std::all_of(tokens.begin(), tokens.end(), [&](int32_t t) { return Accept(t); });
}

}  // namespace pagedserve::grammar
