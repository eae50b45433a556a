#include "runtime/grammar/grammar.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pagedserve::grammar {

int32_t GrammarBuilder::NewRule() {
  rules_.emplace_back();
  repetition_of_.emplace_back();
  return static_cast<int32_t>(rules_.size() - 1);
}

void GrammarBuilder::AddAlt(int32_t rule, const Seq& seq) {
  num_elements_ += seq.size() + 1;
  if (over_limit()) return;  // Build() reports it; stop growing memory
  rules_[rule].push_back(seq);
}

bool GrammarBuilder::over_limit() const { return num_elements_ > Grammar::kMaxElements; }

Element GrammarBuilder::Bytes(const ByteSet& set) {
  for (size_t i = 0; i < byte_sets_.size(); ++i) {
    if (byte_sets_[i] == set) return {Element::kBytes, static_cast<int32_t>(i)};
  }
  byte_sets_.push_back(set);
  return {Element::kBytes, static_cast<int32_t>(byte_sets_.size() - 1)};
}

Element GrammarBuilder::Byte(uint8_t b) {
  ByteSet s;
  s.set(b);
  return Bytes(s);
}

void GrammarBuilder::AppendLiteral(Seq& seq, std::string_view text) {
  for (char c : text) seq.push_back(Byte(static_cast<uint8_t>(c)));
}

int32_t GrammarBuilder::Alternatives(const std::vector<Seq>& alts) {
  const int32_t r = NewRule();
  for (const Seq& a : alts) AddAlt(r, a);
  return r;
}

int32_t GrammarBuilder::Star(const Seq& body) {
  const int32_t r = NewRule();
  Seq loop = body;
  loop.push_back(Ref(r));
  AddAlt(r, loop);
  AddAlt(r, {});
  return r;
}

bool GrammarBuilder::Nullable(const Seq& seq) const {
  // The rules reachable from seq, then a fixpoint: a rule is nullable when
  // some alternative is all references to nullable rules.
  std::vector<int32_t> reach, todo;
  std::vector<bool> seen(rules_.size(), false), nullable(rules_.size(), false);
  auto visit = [&](const Seq& s) {
    for (const Element& e : s) {
      if (e.kind == Element::kRule && e.value >= 0 &&
          static_cast<size_t>(e.value) < rules_.size() && !seen[e.value]) {
        seen[e.value] = true;
        reach.push_back(e.value);
        todo.push_back(e.value);
      }
    }
  };
  visit(seq);
  while (!todo.empty()) {
    const int32_t r = todo.back();
    todo.pop_back();
    for (const Seq& alt : rules_[r]) visit(alt);
  }
  auto all_nullable = [&](const Seq& s) {
    for (const Element& e : s) {
      if (e.kind != Element::kRule || e.value < 0 ||
          static_cast<size_t>(e.value) >= rules_.size() || !nullable[e.value])
        return false;
    }
    return true;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t r : reach) {
      if (nullable[r]) continue;
      for (const Seq& alt : rules_[r]) {
        if (all_nullable(alt)) {
          nullable[r] = changed = true;
          break;
        }
      }
    }
  }
  return all_nullable(seq);
}

int32_t GrammarBuilder::Repeat(const Seq& body, int min, int max) {
  // A * + ? of a term that is itself a * + ? of x is one of x*, x+, x?
  // (same language). Building it as written nests one repetition inside
  // another, and every level doubles the stacks a byte can leave live
  // (fuzz_grammar: "((a+)+)+..." 20 deep took minutes per byte).
  const bool plain = (min == 0 || min == 1) && (max < 0 || (min == 0 && max == 1));
  if (plain && body.size() == 1 && body[0].kind == Element::kRule &&
      repetition_of_[body[0].value].min >= 0) {
    const int32_t inner = body[0].value;
    const Repetition& r = repetition_of_[inner];
    if (r.min == min && r.max == max) return inner;  // x** x++ x??
    if (r.min == 0 && r.max < 0) return inner;       // (x*)+ (x*)?
    return Repeat(Seq(r.body), 0, -1);               // (x+)* (x+)? (x?)* (x?)+
  }
  Seq seq;
  for (int i = 0; i < min; ++i) {
    if (num_elements_ + seq.size() + body.size() > Grammar::kMaxElements) {
      num_elements_ = Grammar::kMaxElements + 1;  // refuse before copying
      return NewRule();
    }
    seq.insert(seq.end(), body.begin(), body.end());
  }
  if (max < 0) {
    seq.push_back(Ref(Star(body)));
  } else if (max > min) {
    // body{0,k} = (body (body (...)?)?)?, built from the inside out.
    int32_t tail = Optional(body);
    for (int64_t i = 1; i < int64_t{max} - min && !over_limit(); ++i) {
      Seq s = body;
      s.push_back(Ref(tail));
      tail = Optional(s);
    }
    seq.push_back(Ref(tail));
  }
  const int32_t rule = Alternatives({seq});
  if (plain) repetition_of_[rule] = {min, max, body};
  return rule;
}

namespace {

// Left recursion: a rule that reaches itself through references each preceded
// only by nullable elements and not in tail position.
absl::Status CheckLeftRecursion(const std::vector<std::vector<GrammarBuilder::Seq>>& rules) {
  const size_t n = rules.size();
  std::vector<char> nullable(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const auto& alt : rules[r]) {
        bool all = std::all_of(alt.begin(), alt.end(), [&](const Element& e) {
          return e.kind == Element::kRule && nullable[e.value];
        });
        if (all) {
          nullable[r] = 1;
          changed = true;
          break;
        }
      }
    }
  }
  std::vector<std::vector<int32_t>> left(n);
  for (size_t r = 0; r < n; ++r) {
    for (const auto& alt : rules[r]) {
      for (size_t i = 0; i < alt.size(); ++i) {
        if (alt[i].kind != Element::kRule) break;
        if (i + 1 < alt.size()) left[r].push_back(alt[i].value);
        if (!nullable[alt[i].value]) break;
      }
    }
  }
  // Iterative DFS for a cycle (0 new, 1 on the path, 2 done).
  std::vector<char> color(n, 0);
  for (size_t root = 0; root < n; ++root) {
    if (color[root]) continue;
    std::vector<std::pair<int32_t, size_t>> path{{static_cast<int32_t>(root), 0}};
    color[root] = 1;
    while (!path.empty()) {
      auto& [r, next] = path.back();
      if (next < left[r].size()) {
        const int32_t c = left[r][next++];
        if (color[c] == 1) {
          return absl::InvalidArgumentError(
              absl::StrCat("grammar is left-recursive (rule ", c, ")"));
        }
        if (color[c] == 0) {
          color[c] = 1;
          path.emplace_back(c, 0);
        }
      } else {
        color[r] = 2;
        path.pop_back();
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Grammar>> GrammarBuilder::Build(int32_t start_rule) {
  if (over_limit()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "constraint too large: its automaton would exceed ", Grammar::kMaxElements, " elements"));
  }
  if (start_rule < 0 || static_cast<size_t>(start_rule) >= rules_.size()) {
    return absl::InternalError("grammar: bad start rule");
  }
  for (size_t r = 0; r < rules_.size(); ++r) {
    if (rules_[r].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("grammar: rule ", r, " has no alternative"));
    }
  }
  if (absl::Status s = CheckLeftRecursion(rules_); !s.ok()) return s;
  auto g = std::shared_ptr<Grammar>(new Grammar());
  g->byte_sets_ = byte_sets_;
  g->rule_alts_.resize(rules_.size());
  for (size_t r = 0; r < rules_.size(); ++r) {
    for (const Seq& alt : rules_[r]) {
      g->rule_alts_[r].push_back(static_cast<int32_t>(g->elements_.size()));
      g->elements_.insert(g->elements_.end(), alt.begin(), alt.end());
      g->elements_.push_back({Element::kEnd, 0});
    }
  }
  // The start: a stack holding a reference to the start rule, expanded.
  g->elements_.push_back({Element::kRule, start_rule});
  g->elements_.push_back({Element::kEnd, 0});
  std::vector<int32_t> stack{static_cast<int32_t>(g->elements_.size() - 2)};
  std::vector<std::vector<int32_t>> out;
  absl::flat_hash_set<std::vector<int32_t>> seen;
  g->Expand(stack, out, seen);
  g->initial_ = g->Canonical(out);
  return std::shared_ptr<const Grammar>(std::move(g));
}

void Grammar::Expand(std::vector<int32_t>& first, std::vector<std::vector<int32_t>>& out,
                     absl::flat_hash_set<std::vector<int32_t>>& seen) const {
  // A work list, not recursion: a chain of rule references (stacked
  // repetitions of a nullable term) can be longer than the thread's stack
  // (fuzz_grammar, 2026-12-06). The result does not depend on the order,
  // unless the work bounds (kMaxLiveStacks, kMaxExpansions) cut it short.
  std::vector<std::vector<int32_t>> work;
  work.push_back(std::move(first));
  while (!work.empty() && out.size() < kMaxLiveStacks && seen.size() < kMaxExpansions) {
    std::vector<int32_t> stack = std::move(work.back());
    work.pop_back();
    while (true) {
      if (stack.empty()) {
        out.push_back(stack);
        break;
      }
      const int32_t top = stack.back();
      const Element& e = elements_[top];
      if (e.kind == Element::kBytes) {
        // An empty class (e.g. JSON Schema `false`) matches nothing: drop the stack.
        if (byte_sets_[e.value].any()) out.push_back(stack);
        break;
      }
      if (e.kind == Element::kEnd) {
        stack.pop_back();
        continue;
      }
      // A rule reference: replace it by each alternative (keeping the return
      // position unless the reference is in tail position).
      if (!seen.insert(stack).second) break;
      stack.pop_back();
      if (elements_[top + 1].kind != Element::kEnd) stack.push_back(top + 1);
      if (stack.size() >= kMaxStackDepth) break;
      for (int32_t start : rule_alts_[e.value]) {
        std::vector<int32_t> s = stack;
        s.push_back(start);
        work.push_back(std::move(s));
      }
      break;
    }
  }
}

GrammarState Grammar::Canonical(std::vector<std::vector<int32_t>>& stacks) const {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  GrammarState st;
  for (const auto& s : stacks) {
    st.stacks.push_back(static_cast<int32_t>(s.size()));
    st.stacks.insert(st.stacks.end(), s.begin(), s.end());
  }
  return st;
}

GrammarState Grammar::Advance(const GrammarState& state, uint8_t byte) const {
  std::vector<std::vector<int32_t>> out;
  absl::flat_hash_set<std::vector<int32_t>> seen;
  const auto& f = state.stacks;
  for (size_t i = 0; i < f.size(); i += f[i] + 1) {
    const int32_t len = f[i];
    if (len == 0) continue;
    const Element& top = elements_[f[i + len]];
    if (top.kind != Element::kBytes || !byte_sets_[top.value].test(byte)) continue;
    std::vector<int32_t> s(f.begin() + i + 1, f.begin() + i + 1 + len);
    s.back() += 1;
    Expand(s, out, seen);
    if (out.size() >= kMaxLiveStacks || seen.size() >= kMaxExpansions) break;
  }
  return Canonical(out);
}

GrammarState Grammar::AdvanceAll(const GrammarState& state, std::string_view bytes) const {
  GrammarState s = state;
  for (char c : bytes) {
    s = Advance(s, static_cast<uint8_t>(c));
    if (s.dead()) break;
  }
  return s;
}

bool Grammar::Accepting(const GrammarState& state) const {
  const auto& f = state.stacks;
  for (size_t i = 0; i < f.size(); i += f[i] + 1) {
    if (f[i] == 0) return true;
  }
  return false;
}

ByteSet Grammar::Allowed(const GrammarState& state) const {
  ByteSet out;
  const auto& f = state.stacks;
  for (size_t i = 0; i < f.size(); i += f[i] + 1) {
    if (f[i] == 0) continue;
    const Element& top = elements_[f[i + f[i]]];
    if (top.kind == Element::kBytes) out |= byte_sets_[top.value];
  }
  return out;
}

}  // namespace pagedserve::grammar
