// One entry point from a request's StructuredOutput (runtime/common/
// structured_output.h) to its Grammar, and a bounded LRU cache of compiled
// constraints so that a schema is compiled once per process.
//
//   kJsonSchema  runtime/grammar/json_schema.h (compact JSON, schema order)
//   kJsonObject  any JSON object, compact
//   kRegex       runtime/grammar/regex.h, whole-output match (re.fullmatch), raw UTF-8
//   kChoice      spec is a JSON array of strings (at least one); the output is
//                exactly one of them
//   kGrammar     runtime/grammar/gbnf.h (llama.cpp's GBNF), start rule `root`
//   kToolCalls   runtime/grammar/tool_call_grammar.h (tool_choice required / named)
//
// Errors: InvalidArgument whose message names what is wrong (a constraint that
// matches no output at all, the unsupported
// keyword, the regex construct, "constraint too large: ..."); the caller adds
// the request field's name (runtime/common/field_error.h).
#ifndef PAGEDSERVE_RUNTIME_GRAMMAR_COMPILE_H_
#define PAGEDSERVE_RUNTIME_GRAMMAR_COMPILE_H_

#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "runtime/common/structured_output.h"
#include "runtime/grammar/grammar.h"

namespace pagedserve::grammar {

absl::StatusOr<std::shared_ptr<const Grammar>> CompileConstraint(const StructuredOutput& c);

// LRU cache keyed by (kind, spec), holding at most `capacity` entries of type T
// (a compiled grammar, or a grammar with its token masks). Failed compilations
// are not cached. Thread-safe (one mutex; Make runs under it, so two threads
// asking for the same constraint compile it once).
template <typename T>
class ConstraintCache {
 public:
  explicit ConstraintCache(size_t capacity) : capacity_(capacity) {}

  template <typename MakeFn>
  absl::StatusOr<std::shared_ptr<T>> GetOrCreate(const StructuredOutput& c, MakeFn make) {
    std::string key = std::string(StructuredOutputKindName(c.kind)) + '\0' + c.spec;
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
    absl::StatusOr<std::shared_ptr<T>> made = make(c);
    if (!made.ok()) return made.status();
    lru_.emplace_front(key, *made);
    index_[key] = lru_.begin();
    while (lru_.size() > capacity_) {
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
    return *made;
  }

  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return lru_.size();
  }

 private:
  using Entry = std::pair<std::string, std::shared_ptr<T>>;
  size_t capacity_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;
  std::unordered_map<std::string, typename std::list<Entry>::iterator> index_;
};

}  // namespace pagedserve::grammar

#endif  // PAGEDSERVE_RUNTIME_GRAMMAR_COMPILE_H_
