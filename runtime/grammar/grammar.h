// A context-free grammar over BYTES and the pushdown automaton that recognizes
// it, the common target of every constraint compiler (JSON Schema, regular
// expressions, choice lists; runtime/grammar/compile.h).
//
// Representation (llama.cpp's grammar-sampling design, llama-grammar.cpp, moved
// from code points to bytes): a grammar is a list of rules; a rule is a list of
// alternatives; an alternative is a sequence of elements, each either a byte
// class (a set of byte values matched by one input byte) or a reference to a
// rule. All alternatives are stored in one flat element array, each terminated
// by an END element, so a position in the grammar is one int32 index.
//
// The automaton: a parse stack is a vector of positions (back() = the element to
// match next; the entries below it are the return positions of the enclosing
// rules). A state is the SET of stacks that are live after the input so far
// (the grammar may be ambiguous or need lookahead, so the automaton runs all
// derivations at once, as llama.cpp does). Every stack in a state has a byte
// class on top, or is empty (the whole start rule matched: the input so far is
// a complete sentence, "accepting"). Advancing by one byte keeps the stacks
// whose top class holds the byte, steps past it and expands rule references and
// finished alternatives until a byte class (or nothing) is on top again. A
// reference to a rule that can derive the empty input is also stepped over,
// and the rule is entered only for its non-empty derivations (Aycock and
// Horspool), so the ways of deriving the empty input never multiply stacks.
// A reference in tail position does not grow the stack (tail calls), so
// right-recursive repetition (x* as R ::= x R | "") runs in constant stack
// depth. Left recursion is rejected at Build() time; stacks deeper than
// kMaxStackDepth are dropped (the grammar then refuses deeper nesting, e.g.
// JSON nested more than ~1000 levels).
//
// Size bound: Build() fails with InvalidArgument once the grammar holds more
// than kMaxElements elements ("constraint too large: ..."), so that a schema or
// regex that would expand (e.g. "a{1000}{1000}") is refused at compile time.
//
// Thread safety: a Grammar is immutable after Build() and may be shared across
// threads. GrammarState is a value type.
#ifndef PAGEDSERVE_RUNTIME_GRAMMAR_GRAMMAR_H_
#define PAGEDSERVE_RUNTIME_GRAMMAR_GRAMMAR_H_

#include <array>
#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"

namespace pagedserve::grammar {

// A set of byte values.
using ByteSet = std::bitset<256>;

// One element of an alternative.
struct Element {
  enum Kind : uint8_t { kBytes, kRule, kEnd };
  Kind kind = kEnd;
  int32_t value = 0;  // kBytes: index into Grammar::byte_sets(); kRule: rule id
};

// A parse state: a sorted set of stacks, flattened as [len, pos...]* so that it
// hashes and compares as one vector. Empty vector = dead (no stack survives).
struct GrammarState {
  std::vector<int32_t> stacks;
  bool operator==(const GrammarState&) const = default;
  bool dead() const { return stacks.empty(); }
};

class Grammar;

// Builds a Grammar. Rule ids are dense from 0; the start rule is chosen at Build().
class GrammarBuilder {
 public:
  // An alternative under construction.
  using Seq = std::vector<Element>;

  int32_t NewRule();
  // Appends alternative `seq` to `rule`.
  void AddAlt(int32_t rule, const Seq& seq);

  // Element constructors.
  Element Bytes(const ByteSet& set);
  Element Byte(uint8_t b);
  static Element Ref(int32_t rule) { return {Element::kRule, rule}; }
  // Appends the bytes of `text` to `seq`.
  void AppendLiteral(Seq& seq, std::string_view text);

  // Rules built from sequences (each returns a new rule id):
  // Alternatives that are all byte sequences (literals: choices, enums,
  // keyword lists) are built as a trie, shared prefixes once, so that a
  // state holds one stack per distinct next byte class, not one per
  // alternative (an enum of 2,000 strings would otherwise hold 2,000).
  int32_t Alternatives(const std::vector<Seq>& alts);
  // A parenthesized group (x|y|...) as one term. With an empty alternative it
  // is built as (x|y|...)?, the same language, so that Repeat can fold a
  // * + ? around it: ((a|)+|)+ is a*, where built as written every nesting
  // level doubled the live stacks.
  Seq Group(const std::vector<Seq>& alts);
  int32_t Star(const Seq& body);  // body*
  int32_t Optional(const Seq& body) { return Alternatives({body, {}}); }
  // body{min,max}; max < 0 = unbounded. Expands into copies of body (the size
  // bound applies). A repetition of a body that is one reference to a rule
  // Repeat built with a variable count is folded into one repetition when the
  // counts allow (x** = x*, (x+)? = x*, (x?){2} = x{0,2},
  // (x{2,3}){1,2} = x{2,6}; not (x{3}){1,2}): the same language without the
  // nesting, whose ambiguity multiplies the automaton's live stacks per level. Build() folds again
  // through named rules (r ::= s+ where s ::= t+ was defined later).
  int32_t Repeat(const Seq& body, int min, int max);

  // True when `seq` can match the empty input (over the rules built so far).
  // Cost: the rules reachable from seq not already known (results are
  // remembered until a rule defined earlier gets an alternative).
  bool Nullable(const Seq& seq) const;
  // A counted repetition x{m,n} with max(m, n) above this, of an x that can
  // match the empty input, is refused by the compilers: every count of
  // empty copies is a live derivation, so each byte costs the square of the
  // count (found by fuzz_grammar: "(|ab){1000}" took minutes per output).
  static constexpr int kMaxNullableRepeat = 16;

  // Elements counted so far (the size bound is checked as the builder grows, so
  // compilers can stop early: see over_limit()).
  size_t num_elements() const { return num_elements_; }
  bool over_limit() const;

  // Validates (every referenced rule has an alternative, no left recursion, the
  // size bound) and freezes.
  absl::StatusOr<std::shared_ptr<const Grammar>> Build(int32_t start_rule);

 private:
  // For a rule Repeat built: body{min,max}; min = -1 for every other rule.
  struct Repetition {
    int min = -1;
    int max = -1;
    Seq body;
  };

  // Repeat() after `depth` folds in a row (at most 64 are taken).
  int32_t RepeatFolding(const Seq& body, int min, int max, int depth);
  // True when following rules that are one reference from `from` reaches
  // `to` (or a cycle). Shortens the chain it walked (each rule on it then
  // refers to the chain's end).
  bool ReferencesReach(int32_t from, int32_t to);
  // Alternatives() of literals: the trie of `alts` as rules.
  int32_t LiteralTrie(const std::vector<Seq>& alts);
  // `rule` through rules that are one reference to another rule (at most 64).
  int32_t Resolve(int32_t rule) const;
  // Folds each repetition whose body resolves to a repetition (Repeat's rule)
  // through named rules, which were not defined yet when it was built.
  void FoldThroughNamedRules();

  std::vector<std::vector<Seq>> rules_;
  std::vector<Repetition> repetition_of_;
  mutable absl::flat_hash_map<int32_t, bool> nullable_memo_;  // Nullable()'s results
  mutable size_t memo_epoch_ = 0;  // rules_.size() at the last Nullable()
  std::vector<ByteSet> byte_sets_;
  size_t num_elements_ = 0;
};

class Grammar {
 public:
  static constexpr size_t kMaxElements = 1 << 20;
  static constexpr size_t kMaxStackDepth = 1024;
  // Work bounds of one Advance (and of the initial state): at most
  // kMaxLiveStacks stacks are kept, kMaxExpansions rule references expanded
  // and kMaxExpandedInts stack entries remembered or copied; past them, and
  // past kMaxStackDepth, the remaining derivations are dropped ("cut";
  // Advance reports it). Expansion is depth first and empty derivations are
  // stepped over, so a cut state holds the stacks found before it: what the
  // automaton then allows is a subset of the language, never outside it. A
  // byte Allowed() offers is refused by Advance only in a step with a cut
  // (every continuation of that byte dropped, e.g. nesting past the depth
  // bound). Build() refuses a grammar whose initial state is cut (e.g. an
  // alternation of more than kMaxLiveStacks patterns that are not literals;
  // literal alternatives share a trie). Past that, only grammars
  // ambiguous in their non-empty derivations reach the work bounds (nested
  // repetitions the compilers could not fold, e.g. x+ written by hand as
  // h ::= x x* and nested; docs/structured-output.md); grammars compiled from
  // JSON Schema and tool sets stay at tens of stacks.
  static constexpr size_t kMaxLiveStacks = 1024;
  static constexpr size_t kMaxExpansions = size_t{1} << 18;
  static constexpr size_t kMaxExpandedInts = size_t{1} << 22;

  // The state before any input.
  const GrammarState& initial() const { return initial_; }
  // The state after one more byte (dead() when the byte is not allowed).
  // `cut` (optional) is set when a bound dropped derivations in this step
  // (kMaxLiveStacks, kMaxExpansions, kMaxExpandedInts, kMaxStackDepth).
  GrammarState Advance(const GrammarState& state, uint8_t byte, bool* cut = nullptr) const;
  // The state after `bytes` (dead() on the first byte not allowed).
  GrammarState AdvanceAll(const GrammarState& state, std::string_view bytes) const;
  // True when the input so far is a complete sentence.
  bool Accepting(const GrammarState& state) const;
  // The bytes allowed next: union of the top byte classes.
  ByteSet Allowed(const GrammarState& state) const;
  // Whole-input match (tests, admission checks).
  bool Matches(std::string_view bytes) const { return Accepting(AdvanceAll(initial_, bytes)); }

  size_t num_elements() const { return elements_.size(); }
  size_t num_rules() const { return rule_alts_.size(); }

 private:
  friend class GrammarBuilder;
  Grammar() = default;
  // The expansions of one Advance: the stacks with a rule reference on top
  // already expanded (their results are in the output already; shared by
  // every stack of the step, so that ambiguous grammars do not expand the same
  // stack once per live stack: fuzz_grammar's second timeout, 2026-12-06).
  struct ExpandBudget {
    absl::flat_hash_set<std::vector<int32_t>> seen;
    size_t seen_ints = 0;  // entries of the remembered and the pushed stacks
    bool cut = false;      // a bound (work or depth) dropped a derivation
    // False when `stack` was expanded already in this step.
    bool Insert(const std::vector<int32_t>& stack);
    // True (and `cut` set) when the work bounds are reached with
    // `live_stacks` in the output.
    bool Spent(size_t live_stacks);
  };
  // A stack entry with this bit set is a "fresh" frame: the rule's alternative
  // has consumed no input yet, so reaching its end would be an empty
  // derivation (already taken by stepping over the reference). Only inside
  // Expand; states never hold it.
  static constexpr int32_t kFresh = int32_t{1} << 30;
  // Pushes onto `work` the alternatives of `rule`, referenced at `pos` on top
  // of `stack`, each as a fresh frame (Expand's non-empty derivations).
  void EnterRule(const std::vector<int32_t>& stack, int32_t pos, int32_t rule,
                 std::vector<std::vector<int32_t>>& work, ExpandBudget& budget) const;
  // Expands `stack` until a byte class or nothing is on top; appends results.
  void Expand(std::vector<int32_t> stack, std::vector<std::vector<int32_t>>& out,
              ExpandBudget& budget) const;
  GrammarState Canonical(std::vector<std::vector<int32_t>>& stacks) const;

  std::vector<Element> elements_;
  std::vector<ByteSet> byte_sets_;
  std::vector<std::vector<int32_t>> rule_alts_;  // start positions of productive alternatives
  std::vector<uint8_t> nullable_;                // per rule: derives the empty input
  std::vector<uint8_t> nonempty_;                // per rule: derives some non-empty input
  GrammarState initial_;
};

}  // namespace pagedserve::grammar

#endif  // PAGEDSERVE_RUNTIME_GRAMMAR_GRAMMAR_H_
