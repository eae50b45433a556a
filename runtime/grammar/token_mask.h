// Token masks for constrained decoding: which vocabulary tokens the grammar's
// automaton accepts next (runtime/grammar/grammar.h).
//
// TokenVocabulary: the bytes of every token id (what the tokenizer's decoding
// of that id alone contributes to the output: byte-level BPE bytes, or the
// "<0xXX>" byte of SentencePiece byte fallback, "▁" as a space) in a trie, and
// the end-of-sequence ids. A token with no bytes (a special/control token other
// than an end token) is never allowed under a constraint.
//
// CompiledConstraint: a Grammar bound to a vocabulary, with a cache of the
// automaton's states (interned), their byte transitions (filled lazily) and the
// mask of each state reached at a token boundary (memoized). A mask is computed
// by walking the vocabulary trie with the automaton (each trie edge one cached
// byte transition; a dead state prunes the subtree), as llama.cpp's grammar
// sampler does per candidate token, but once per automaton state. End ids are
// allowed exactly where the automaton accepts; where the automaton accepts and
// can go no further, only the end ids are allowed. Cost per step: one hash
// lookup of the state when its mask is cached; the first visit of a state costs
// a trie walk (bounded by the trie's size, usually far less: dead subtrees are
// pruned at their first byte).
//
// Memory bound: at most kMaxCachedStates interned states and kMaxCachedMasks
// masks per constraint; past either, the cache is cleared and refilled (the
// matchers hold their state by value, so this is only a cost).
//
// Thread safety: TokenVocabulary is immutable. CompiledConstraint is
// thread-safe (one mutex around its cache). ConstraintMatcher is a value type
// for one sequence, used by one thread at a time.
#ifndef PAGEDSERVE_RUNTIME_GRAMMAR_TOKEN_MASK_H_
#define PAGEDSERVE_RUNTIME_GRAMMAR_TOKEN_MASK_H_

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "runtime/grammar/grammar.h"

namespace pagedserve::grammar {

// A bitmask over the vocabulary: bit i of word i / 64 set = token i allowed.
using TokenMask = std::vector<uint64_t>;

inline bool MaskAllows(const TokenMask& m, int32_t id) {
  return (m[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1;
}

class TokenVocabulary {
 public:
  // token_bytes[id]: the bytes of token id (empty = never allowed).
  // end_ids: every end-of-sequence id of the model (each in range).
  static absl::StatusOr<std::shared_ptr<const TokenVocabulary>> Create(
      std::vector<std::string> token_bytes, std::vector<int32_t> end_ids);

  int32_t size() const { return static_cast<int32_t>(token_bytes_.size()); }
  const std::string& bytes(int32_t id) const { return token_bytes_[id]; }
  const std::vector<int32_t>& end_ids() const { return end_ids_; }

  // The trie: node 0 is the root; children of node n are edges
  // [edge_begin[n], edge_begin[n + 1]) of (byte, child); tokens ending at n are
  // tokens[token_begin[n], token_begin[n + 1]).
  struct Trie {
    std::vector<uint32_t> edge_begin;
    std::vector<uint8_t> edge_byte;
    std::vector<int32_t> edge_child;
    std::vector<uint32_t> token_begin;
    std::vector<int32_t> tokens;
  };
  const Trie& trie() const { return trie_; }

 private:
  TokenVocabulary() = default;
  std::vector<std::string> token_bytes_;
  std::vector<int32_t> end_ids_;
  Trie trie_;
};

class CompiledConstraint {
 public:
  static constexpr size_t kMaxCachedStates = 8192;
  static constexpr size_t kMaxCachedMasks = 1024;

  CompiledConstraint(std::shared_ptr<const Grammar> grammar,
                     std::shared_ptr<const TokenVocabulary> vocab);

  const Grammar& grammar() const { return *grammar_; }
  const TokenVocabulary& vocab() const { return *vocab_; }

  // The mask of `state` (size ceil(vocab / 64) words). Never all-zero for a
  // live state when the vocabulary has an end id or covers the grammar's bytes.
  std::shared_ptr<const TokenMask> Mask(const GrammarState& state);

  // Cache statistics (tests, benchmarks).
  size_t cached_states() const;
  size_t mask_computations() const;

 private:
  struct Entry {
    GrammarState state;
    ByteSet allowed;                                 // Grammar::Allowed(state)
    std::unique_ptr<std::array<int32_t, 256>> next;  // -2 unknown, -1 dead
    std::shared_ptr<const TokenMask> mask;
  };
  int32_t InternLocked(GrammarState state);
  int32_t NextLocked(int32_t id, uint8_t byte);
  void WalkLocked(int32_t node, int32_t state, TokenMask& mask);

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
  absl::flat_hash_map<std::vector<int32_t>, int32_t> ids_;
  size_t masks_ = 0;
  size_t mask_computations_ = 0;
};

// The automaton state of one sequence under a constraint.
class ConstraintMatcher {
 public:
  explicit ConstraintMatcher(std::shared_ptr<CompiledConstraint> c)
      : c_(std::move(c)), state_(c_->grammar().initial()) {}

  // Advances by `token`'s bytes. An end id is accepted when the state accepts
  // (then finished() becomes true). Returns false, leaving the state
  // unchanged, for a token the mask would not allow.
  bool Accept(int32_t token);
  // Accept() for every token in order; false at the first refused one.
  bool AcceptAll(std::span<const int32_t> tokens);

  std::shared_ptr<const TokenMask> Mask() const { return c_->Mask(state_); }
  bool accepting() const { return c_->grammar().Accepting(state_); }
  bool finished() const { return finished_; }
  const GrammarState& state() const { return state_; }

 private:
  std::shared_ptr<CompiledConstraint> c_;
  GrammarState state_;
  bool finished_ = false;
};

}  // namespace pagedserve::grammar

#endif  // PAGEDSERVE_RUNTIME_GRAMMAR_TOKEN_MASK_H_
