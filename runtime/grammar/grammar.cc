#include "runtime/grammar/grammar.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace pagedserve::grammar {

int32_t GrammarBuilder::NewRule() {
  rules_.emplace_back();
  repetition_of_.emplace_back();
  return static_cast<int32_t>(rules_.size() - 1);
}

void GrammarBuilder::AddAlt(int32_t rule, const Seq& seq) {
  if (static_cast<size_t>(rule) < memo_epoch_) nullable_memo_.clear();
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
  const bool literals = alts.size() > 1 && std::all_of(alts.begin(), alts.end(), [](const Seq& a) {
                          return std::all_of(a.begin(), a.end(), [](const Element& e) {
                            return e.kind == Element::kBytes;
                          });
                        });
  if (literals) return LiteralTrie(alts);
  const int32_t r = NewRule();
  for (const Seq& a : alts) AddAlt(r, a);
  return r;
}

int32_t GrammarBuilder::LiteralTrie(const std::vector<Seq>& alts) {
  struct Node {
    std::vector<std::pair<int32_t, int32_t>> children;  // (byte set index, node)
    bool end = false;                                   // an alternative ends here
  };
  std::vector<Node> nodes(1);
  for (const Seq& a : alts) {
    int32_t n = 0;
    for (const Element& e : a) {
      auto& ch = nodes[n].children;
      auto it =
          std::find_if(ch.begin(), ch.end(), [&](const auto& c) { return c.first == e.value; });
      if (it != ch.end()) {
        n = it->second;
        continue;
      }
      const auto child = static_cast<int32_t>(nodes.size());
      nodes[n].children.emplace_back(e.value, child);
      nodes.emplace_back();
      n = child;
    }
    nodes[n].end = true;
  }
  // The language from node n as a sequence: a chain of single children is
  // spelled out; a branching node becomes a rule of its branches. Recursion
  // depth = branching nodes on one path (at most ~sqrt(2 * total bytes)).
  std::function<Seq(int32_t)> emit = [&](int32_t n) {
    Seq seq;
    while (nodes[n].children.size() == 1 && !nodes[n].end) {
      seq.push_back({Element::kBytes, nodes[n].children[0].first});
      n = nodes[n].children[0].second;
    }
    if (nodes[n].children.empty()) return seq;
    const int32_t rule = NewRule();
    for (const auto& [set, child] : nodes[n].children) {
      Seq branch{{Element::kBytes, set}};
      const Seq rest = emit(child);
      branch.insert(branch.end(), rest.begin(), rest.end());
      AddAlt(rule, branch);
    }
    if (nodes[n].end) AddAlt(rule, {});
    seq.push_back(Ref(rule));
    return seq;
  };
  const Seq whole = emit(0);
  if (whole.size() == 1 && whole[0].kind == Element::kRule) return whole[0].value;
  const int32_t r = NewRule();
  AddAlt(r, whole);
  return r;
}

GrammarBuilder::Seq GrammarBuilder::Group(const std::vector<Seq>& alts) {
  std::vector<Seq> nonempty;
  for (const Seq& a : alts) {
    if (!a.empty()) nonempty.push_back(a);
  }
  if (nonempty.size() == alts.size()) {
    return alts.size() == 1 ? alts[0] : Seq{Ref(Alternatives(alts))};
  }
  if (nonempty.empty()) return {};
  Seq body = nonempty.size() == 1 ? nonempty[0] : Seq{Ref(Alternatives(nonempty))};
  return {Ref(Repeat(body, 0, 1))};
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
  // The rules reachable from seq, then a work list (linear in their size): a
  // rule is nullable once one alternative has all its references nullable
  // (an alternative with a byte class never is).
  // Results are remembered (nullable_memo_) until a rule that existed at the
  // last query gets an alternative (AddAlt: a named rule defined after its
  // use), so a grammar of many counted repetitions of one long chain costs
  // the chain once, not once per repetition.
  std::vector<int32_t> reach, todo;
  absl::flat_hash_map<int32_t, int32_t> index;  // rule -> position in reach
  auto valid = [&](const Element& e) {
    return e.kind == Element::kRule && e.value >= 0 && static_cast<size_t>(e.value) < rules_.size();
  };
  auto visit = [&](const Seq& s) {
    for (const Element& e : s) {
      if (valid(e) && !nullable_memo_.contains(e.value) &&
          index.emplace(e.value, static_cast<int32_t>(reach.size())).second) {
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
  std::vector<uint8_t> nullable(reach.size(), 0);
  std::vector<int64_t> pending;    // per reachable alternative
  std::vector<int32_t> alt_owner;  // its rule's position in reach
  std::vector<std::vector<int32_t>> uses(reach.size());
  std::vector<int32_t> ready;
  for (size_t i = 0; i < reach.size(); ++i) {
    for (const Seq& alt : rules_[reach[i]]) {
      const auto a = static_cast<int32_t>(pending.size());
      int64_t count = 0;
      for (const Element& e : alt) {
        const auto memo = valid(e) ? nullable_memo_.find(e.value) : nullable_memo_.end();
        if (!valid(e) || (memo != nullable_memo_.end() && !memo->second)) {
          count = -1;  // a byte class or a rule known not nullable
          break;
        }
        if (memo == nullable_memo_.end()) ++count;
      }
      pending.push_back(count);
      alt_owner.push_back(static_cast<int32_t>(i));
      if (count < 0) continue;
      for (const Element& e : alt) {
        if (!nullable_memo_.contains(e.value)) uses[index[e.value]].push_back(a);
      }
      if (count == 0) ready.push_back(static_cast<int32_t>(i));
    }
  }
  while (!ready.empty()) {
    const int32_t i = ready.back();
    ready.pop_back();
    if (nullable[i]) continue;
    nullable[i] = 1;
    for (int32_t a : uses[i]) {
      if (--pending[a] == 0) ready.push_back(alt_owner[a]);
    }
  }
  for (size_t i = 0; i < reach.size(); ++i) nullable_memo_[reach[i]] = nullable[i] != 0;
  memo_epoch_ = rules_.size();
  return std::all_of(seq.begin(), seq.end(),
                     [&](const Element& e) { return valid(e) && nullable_memo_[e.value]; });
}

namespace {

// x{a,b}{c,d} (b, d < 0 = unbounded) as one x{lo,hi}, when the counts it
// allows, the union over k in [c, d] of [k*a, k*b], are an interval: with one
// count (c == d), with a == 0, or when each [k*a, k*b] reaches the next
// ((k+1)*a <= k*b + 1, tightest at k = c). (x{3}){1,2} = x{3}|x{6} is not.
struct Counts {
  int64_t lo, hi;
};
std::optional<Counts> FoldCounts(int64_t a, int64_t b, int64_t c, int64_t d) {
  if (d == 0 || b == 0) return Counts{0, 0};  // no copy, or copies of nothing
  const bool interval =
      c == d || a == 0 || (b < 0 ? (c >= 1 || a <= 1) : (a <= b && a - 1 <= c * (b - a)));
  if (!interval) return std::nullopt;
  return Counts{c * a, (b < 0 || d < 0) ? -1 : d * b};
}

}  // namespace

int32_t GrammarBuilder::Repeat(const Seq& body, int min, int max) {
  return RepeatFolding(body, min, max, /*depth=*/0);
}

int32_t GrammarBuilder::RepeatFolding(const Seq& body, int min, int max, int depth) {
  // A repetition of a term that is itself one repetition of x is one
  // repetition of x when the counts allow (FoldCounts: x** = x*, (x+)? = x*,
  // (x?){2} = x{0,2}, ...). Building it as written nests one repetition
  // inside another, and every level doubles the stacks a byte can leave live
  // (fuzz_grammar: "((a+)+)+..." 20 deep took minutes per byte).
  // depth: folds in a row. Records that refer back to their own rule (a
  // named rule inside its own repetition, r1 ::= r1{3}?, after
  // FoldThroughNamedRules) would fold forever; 64 in a row stops that.
  if (depth < 64 && body.size() == 1 && body[0].kind == Element::kRule &&
      repetition_of_[body[0].value].min >= 0) {
    const int32_t inner = body[0].value;
    const Repetition r = repetition_of_[inner];
    // Only a variable count is ambiguous; an exact one nested stays linear in
    // size where folded it would multiply ((x{2}){2}... 20 deep = x{2^20}).
    std::optional<Counts> c;
    if (r.min != r.max) c = FoldCounts(r.min, r.max, min, max);
    if (c) {
      if (c->lo == r.min && c->hi == r.max) return inner;
      if (c->lo > static_cast<int64_t>(Grammar::kMaxElements) ||
          c->hi > static_cast<int64_t>(Grammar::kMaxElements)) {
        num_elements_ = Grammar::kMaxElements + 1;  // too large: Build() refuses
        return NewRule();
      }
      return RepeatFolding(r.body, static_cast<int>(c->lo), static_cast<int>(c->hi), depth + 1);
    }
  }
  // The elements this adds: min copies of body, then (max - min) optional
  // rules of body + a reference (two alternatives, each with its END) or one
  // star rule. Refused before anything is copied when over the bound.
  const auto n = static_cast<int64_t>(body.size());
  const int64_t adds = int64_t{min} * n + (max < 0 ? n + 4 : (int64_t{max} - min) * (n + 3)) + 2;
  if (static_cast<int64_t>(num_elements_) + adds > static_cast<int64_t>(Grammar::kMaxElements)) {
    num_elements_ = Grammar::kMaxElements + 1;
    return NewRule();
  }
  Seq seq;
  for (int i = 0; i < min; ++i) seq.insert(seq.end(), body.begin(), body.end());
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
  repetition_of_[rule] = {min, max, body};
  return rule;
}

int32_t GrammarBuilder::Resolve(int32_t rule) const {
  for (int steps = 0; steps < 64 && repetition_of_[rule].min < 0 && rules_[rule].size() == 1 &&
                      rules_[rule][0].size() == 1 && rules_[rule][0][0].kind == Element::kRule &&
                      rules_[rule][0][0].value != rule;
       ++steps) {
    rule = rules_[rule][0][0].value;
  }
  return rule;
}

bool GrammarBuilder::ReferencesReach(int32_t from, int32_t to) {
  std::vector<int32_t> path;
  absl::flat_hash_set<int32_t> seen;
  auto one_reference = [&](int32_t r) {
    return rules_[r].size() == 1 && rules_[r][0].size() == 1 &&
           rules_[r][0][0].kind == Element::kRule;
  };
  while (from != to) {
    if (!seen.insert(from).second) return true;  // a cycle of references
    if (!one_reference(from)) {
      // `from` ends the chain: point every rule on the way at it (the same
      // language), so that later walks along a long chain are short.
      for (int32_t r : path) rules_[r][0][0].value = from;
      return false;
    }
    path.push_back(from);
    from = rules_[from][0][0].value;
  }
  return true;
}

void GrammarBuilder::FoldThroughNamedRules() {
  const size_t n = rules_.size();  // rules Repeat adds here are folded already
  for (size_t r = 0; r < n && !over_limit(); ++r) {
    const Repetition rep = repetition_of_[r];
    if (rep.min < 0 || rep.body.size() != 1 || rep.body[0].kind != Element::kRule) continue;
    const int32_t target = Resolve(rep.body[0].value);
    if (target == rep.body[0].value || repetition_of_[target].min < 0) continue;
    const int32_t folded = Repeat({Ref(target)}, rep.min, rep.max);
    // An existing rule whose references lead back to r: making r a reference
    // to it would close a cycle of references with no alternative left
    // (x ::= y?, y ::= x*: both folded into each other derived nothing).
    if (folded == static_cast<int32_t>(r) || ReferencesReach(folded, static_cast<int32_t>(r))) {
      continue;
    }
    rules_[r] = {{Ref(folded)}};
    num_elements_ += 2;
    repetition_of_[r] = repetition_of_[folded];
  }
}

namespace {

// Left recursion: a rule that reaches itself through references each
// preceded only by nullable elements, where at least one of them is not in
// tail position (such a cycle grows the stack without consuming input). A
// cycle of tail references only (S ::= X S with X nullable, what Star builds
// of a nullable body) keeps the stack as it is and is expanded once per step.
// Checked on the strongly connected components of the left-corner graph
// (Tarjan's algorithm, iterative): a non-tail edge inside one is a cycle.
absl::Status CheckLeftRecursion(const std::vector<std::vector<GrammarBuilder::Seq>>& rules,
                                const std::vector<uint8_t>& nullable) {
  const size_t n = rules.size();
  struct Edge {
    int32_t to;
    bool tail;
  };
  std::vector<std::vector<Edge>> left(n);
  for (size_t r = 0; r < n; ++r) {
    for (const auto& alt : rules[r]) {
      for (size_t i = 0; i < alt.size(); ++i) {
        if (alt[i].kind != Element::kRule) break;
        left[r].push_back({alt[i].value, i + 1 == alt.size()});
        if (!nullable[alt[i].value]) break;
      }
    }
  }
  std::vector<int32_t> index(n, -1), low(n, 0), component(n, -1), stack;
  std::vector<char> on_stack(n, 0);
  int32_t next_index = 0;
  for (size_t root = 0; root < n; ++root) {
    if (index[root] >= 0) continue;
    std::vector<std::pair<int32_t, size_t>> path{{static_cast<int32_t>(root), 0}};
    index[root] = low[root] = next_index++;
    stack.push_back(static_cast<int32_t>(root));
    on_stack[root] = 1;
    while (!path.empty()) {
      auto& [r, next] = path.back();
      if (next < left[r].size()) {
        const int32_t c = left[r][next++].to;
        if (index[c] < 0) {
          index[c] = low[c] = next_index++;
          stack.push_back(c);
          on_stack[c] = 1;
          path.emplace_back(c, 0);
        } else if (on_stack[c]) {
          low[r] = std::min(low[r], index[c]);
        }
        continue;
      }
      const int32_t done = r;
      if (low[done] == index[done]) {
        int32_t v;
        do {
          v = stack.back();
          stack.pop_back();
          on_stack[v] = 0;
          component[v] = done;
        } while (v != done);
      }
      path.pop_back();
      if (!path.empty()) low[path.back().first] = std::min(low[path.back().first], low[done]);
    }
  }
  for (size_t r = 0; r < n; ++r) {
    for (const Edge& e : left[r]) {
      if (!e.tail && component[e.to] == component[r]) {
        return absl::InvalidArgumentError(
            absl::StrCat("grammar is left-recursive (rule ", e.to, ")"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// Per rule: whether it derives the empty input (nullable), derives anything at
// all (productive), and derives some non-empty input. Fixpoints over the rules.
struct RuleFacts {
  std::vector<uint8_t> nullable, productive, nonempty;
};

// Linear in the grammar's size (a work list over the references to each rule,
// not repeated passes: a chain of 100,000 rules would take 100,000 passes).
RuleFacts ComputeRuleFacts(const std::vector<std::vector<GrammarBuilder::Seq>>& rules,
                           const std::vector<ByteSet>& byte_sets) {
  const size_t n = rules.size();
  std::vector<const GrammarBuilder::Seq*> alts;
  std::vector<int32_t> alt_rule;
  std::vector<std::vector<int32_t>> uses(n);  // per rule: the alternatives referencing it
  for (size_t r = 0; r < n; ++r) {
    for (const auto& alt : rules[r]) {
      const auto a = static_cast<int32_t>(alts.size());
      alts.push_back(&alt);
      alt_rule.push_back(static_cast<int32_t>(r));
      for (const Element& e : alt) {
        if (e.kind == Element::kRule) uses[e.value].push_back(a);
      }
    }
  }
  // "All elements have the property": a count of the references still
  // unknown per alternative; an alternative with a byte class that lacks the
  // property never gets it.
  auto all_of = [&](auto&& byte_ok) {
    std::vector<uint8_t> flag(n, 0);
    std::vector<int64_t> pending(alts.size(), 0);
    std::vector<int32_t> ready;
    auto mark = [&](int32_t r) {
      if (!flag[r]) {
        flag[r] = 1;
        ready.push_back(r);
      }
    };
    for (size_t a = 0; a < alts.size(); ++a) {
      for (const Element& e : *alts[a]) {
        if (e.kind == Element::kRule) {
          ++pending[a];
        } else if (!byte_ok(e)) {
          pending[a] = INT64_MIN / 2;  // never
        }
      }
      if (pending[a] == 0) mark(alt_rule[a]);
    }
    while (!ready.empty()) {
      const int32_t r = ready.back();
      ready.pop_back();
      for (int32_t a : uses[r]) {
        if (--pending[a] == 0) mark(alt_rule[a]);
      }
    }
    return flag;
  };
  RuleFacts f;
  f.nullable = all_of([](const Element&) { return false; });
  f.productive = all_of([&](const Element& e) { return byte_sets[e.value].any(); });
  // Non-empty: a productive alternative with a byte class or a reference to a
  // non-empty rule.
  std::vector<uint8_t> alt_productive(alts.size());
  for (size_t a = 0; a < alts.size(); ++a) {
    alt_productive[a] = std::all_of(alts[a]->begin(), alts[a]->end(), [&](const Element& e) {
      return e.kind == Element::kBytes ? byte_sets[e.value].any() : f.productive[e.value] != 0;
    });
  }
  f.nonempty.assign(n, 0);
  std::vector<int32_t> ready;
  for (size_t a = 0; a < alts.size(); ++a) {
    const bool has_byte = std::any_of(alts[a]->begin(), alts[a]->end(),
                                      [](const Element& e) { return e.kind == Element::kBytes; });
    const int32_t r = alt_rule[a];
    if (has_byte && !f.nonempty[r] && alt_productive[a]) {
      f.nonempty[r] = 1;
      ready.push_back(r);
    }
  }
  while (!ready.empty()) {
    const int32_t r = ready.back();
    ready.pop_back();
    for (int32_t a : uses[r]) {
      const int32_t user = alt_rule[a];
      if (!f.nonempty[user] && alt_productive[a]) {
        f.nonempty[user] = 1;
        ready.push_back(user);
      }
    }
  }
  return f;
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
  FoldThroughNamedRules();
  if (over_limit()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "constraint too large: its automaton would exceed ", Grammar::kMaxElements, " elements"));
  }
  RuleFacts facts = ComputeRuleFacts(rules_, byte_sets_);
  if (absl::Status s = CheckLeftRecursion(rules_, facts.nullable); !s.ok()) return s;
  auto g = std::shared_ptr<Grammar>(new Grammar());
  g->byte_sets_ = byte_sets_;
  g->rule_alts_.resize(rules_.size());
  for (size_t r = 0; r < rules_.size(); ++r) {
    for (const Seq& alt : rules_[r]) {
      // An alternative that derives nothing (an empty byte class, e.g. JSON
      // Schema `false`, or a rule that derives nothing) is never entered, so
      // that every stack the automaton keeps can be completed.
      const bool productive = std::all_of(alt.begin(), alt.end(), [&](const Element& e) {
        return e.kind == Element::kBytes ? byte_sets_[e.value].any()
                                         : facts.productive[e.value] != 0;
      });
      if (productive) g->rule_alts_[r].push_back(static_cast<int32_t>(g->elements_.size()));
      g->elements_.insert(g->elements_.end(), alt.begin(), alt.end());
      g->elements_.push_back({Element::kEnd, 0});
    }
  }
  g->nullable_ = std::move(facts.nullable);
  g->nonempty_ = std::move(facts.nonempty);
  // The start: a stack holding a reference to the start rule, expanded.
  g->elements_.push_back({Element::kRule, start_rule});
  g->elements_.push_back({Element::kEnd, 0});
  std::vector<std::vector<int32_t>> out;
  Grammar::ExpandBudget budget;
  g->Expand({static_cast<int32_t>(g->elements_.size() - 2)}, out, budget);
  if (budget.cut) {
    // E.g. an enum or choice of more than kMaxLiveStacks entries: refused
    // rather than losing some of them.
    return absl::InvalidArgumentError(absl::StrCat(
        "constraint too large: its first byte alone has more than ", Grammar::kMaxLiveStacks,
        " live alternatives (or exceeds the automaton's work bounds)"));
  }
  g->initial_ = g->Canonical(out);
  return std::shared_ptr<const Grammar>(std::move(g));
}

void Grammar::Expand(std::vector<int32_t> first, std::vector<std::vector<int32_t>>& out,
                     ExpandBudget& budget) const {
  // A work list, not recursion: a chain of rule references can be longer than
  // the thread's stack (fuzz_grammar, 2026-12-06). The result does not depend
  // on the order unless the budget cuts it short; depth first, every path
  // reaches a byte class (or the empty stack) within the grammar's nesting, so
  // a cut keeps the stacks found so far and loses only the rest.
  std::vector<std::vector<int32_t>> work;
  work.push_back(std::move(first));
  while (!work.empty() && !budget.Spent(out.size())) {
    std::vector<int32_t> stack = std::move(work.back());
    work.pop_back();
    while (true) {
      if (stack.empty()) {
        out.push_back(stack);
        break;
      }
      const bool fresh = (stack.back() & kFresh) != 0;
      const int32_t pos = stack.back() & ~kFresh;
      const Element& e = elements_[pos];
      if (e.kind == Element::kBytes) {
        stack.back() = pos;
        out.push_back(stack);
        break;
      }
      if (e.kind == Element::kEnd) {
        // A fresh frame at its end derived the empty input: that derivation
        // was taken by stepping over the reference, not here.
        if (fresh) break;
        stack.pop_back();
        continue;
      }
      // A rule reference. Aycock and Horspool's treatment of nullable rules
      // ("Practical Earley Parsing", 2002), on stacks: the empty derivation is
      // a step over the reference; the rule is entered (its alternatives
      // pushed fresh) only for its non-empty derivations. Entering a nullable
      // rule for the empty input as well would make every way of deriving it
      // a separate stack (rules that only derive it, nested, are exponential).
      if (!budget.Insert(stack)) break;
      const int32_t rule = e.value;
      if (nonempty_[rule]) EnterRule(stack, pos, rule, work, budget);
      if (!nullable_[rule]) break;
      stack.back() = (pos + 1) | (fresh ? kFresh : 0);
    }
  }
}

void Grammar::EnterRule(const std::vector<int32_t>& stack, int32_t pos, int32_t rule,
                        std::vector<std::vector<int32_t>>& work, ExpandBudget& budget) const {
  // After the rule the frame has consumed input, so the return position is
  // not fresh; in tail position there is none.
  std::vector<int32_t> base(stack.begin(), stack.end() - 1);
  if (elements_[pos + 1].kind != Element::kEnd) base.push_back(pos + 1);
  if (base.size() >= kMaxStackDepth) {
    budget.cut = true;
    return;
  }
  for (int32_t start : rule_alts_[rule]) {
    // Every pushed copy counts (a rule of 100,000 alternatives entered at
    // depth 1,000 would copy 10^8 entries).
    budget.seen_ints += base.size() + 1;
    if (budget.seen_ints >= kMaxExpandedInts) {
      budget.cut = true;
      return;
    }
    std::vector<int32_t> s = base;
    s.push_back(start | kFresh);
    work.push_back(std::move(s));
  }
}

bool Grammar::ExpandBudget::Insert(const std::vector<int32_t>& stack) {
  if (!seen.insert(stack).second) return false;
  seen_ints += stack.size();
  return true;
}

bool Grammar::ExpandBudget::Spent(size_t live_stacks) {
  const bool spent = live_stacks >= kMaxLiveStacks || seen.size() >= kMaxExpansions ||
                     seen_ints >= kMaxExpandedInts;
  cut = cut || spent;
  return spent;
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

GrammarState Grammar::Advance(const GrammarState& state, uint8_t byte, bool* cut) const {
  std::vector<std::vector<int32_t>> out;
  ExpandBudget budget;
  const auto& f = state.stacks;
  for (size_t i = 0; i < f.size() && !budget.Spent(out.size()); i += f[i] + 1) {
    const int32_t len = f[i];
    if (len == 0) continue;
    const Element& top = elements_[f[i + len]];
    if (top.kind != Element::kBytes || !byte_sets_[top.value].test(byte)) continue;
    std::vector<int32_t> s(f.begin() + i + 1, f.begin() + i + 1 + len);
    s.back() += 1;
    Expand(std::move(s), out, budget);
  }
  if (cut != nullptr) *cut = budget.cut;
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
