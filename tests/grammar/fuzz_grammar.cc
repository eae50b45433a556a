// libFuzzer target for the constraint compilers (runtime/grammar/compile.h):
// the first byte picks the kind (JSON Schema, regex, choice, json_object,
// tool calls), the rest is the constraint's text. Invariants: compiling never crashes or hangs;
// a refusal is InvalidArgument; a compiled grammar stays within
// Grammar::kMaxElements; the automaton then runs on bytes of the input (a walk
// that follows Allowed(), and whole-input matching) without crashing, and a
// token mask over a small vocabulary is consistent with the automaton.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "runtime/common/structured_output.h"
#include "runtime/grammar/compile.h"
#include "runtime/grammar/token_mask.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    __builtin_printf("invariant violated: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using pagedserve::StructuredOutput;
  namespace g = pagedserve::grammar;
  if (size < 1) return 0;
  static const StructuredOutput::Kind kKinds[] = {
      StructuredOutput::Kind::kJsonSchema, StructuredOutput::Kind::kRegex,
      StructuredOutput::Kind::kChoice,     StructuredOutput::Kind::kJsonObject,
      StructuredOutput::Kind::kToolCalls,  StructuredOutput::Kind::kGrammar};
  StructuredOutput c{kKinds[data[0] % 6],
                     std::string(reinterpret_cast<const char*>(data + 1), size - 1)};
  auto compiled = g::CompileConstraint(c);
  if (!compiled.ok()) {
    Check(compiled.status().code() == absl::StatusCode::kInvalidArgument,
          "refusal is InvalidArgument");
    return 0;
  }
  const g::Grammar& gr = **compiled;
  Check(gr.num_elements() <= g::Grammar::kMaxElements + 2, "size bound");
  // A walk: at each step take the input byte if allowed, else the lowest allowed byte.
  g::GrammarState s = gr.initial();
  for (size_t i = 0; i < 64 && !s.dead(); ++i) {
    const g::ByteSet allowed = gr.Allowed(s);
    if (allowed.none()) {
      Check(gr.Accepting(s), "a live state with no allowed byte accepts");
      break;
    }
    int b = size > 1 ? data[1 + i % (size - 1)] : 0;
    if (!allowed.test(b)) {
      b = 0;
      while (!allowed.test(b)) ++b;
    }
    bool cut = false;
    s = gr.Advance(s, static_cast<uint8_t>(b), &cut);
    // Only a step that hit a bound (Grammar::kMaxStackDepth, the work bounds)
    // may drop every continuation of an allowed byte.
    Check(!s.dead() || cut, "an allowed byte keeps the automaton alive");
  }
  (void)gr.Matches(c.spec);
  static const auto vocab =
      *g::TokenVocabulary::Create({"", "{", "}", "\"", "a", "1", ":", ",", "[", "]", "true", "null",
                                   "ab", "\xc3\xa9", "-", "."},
                                  {0});
  g::CompiledConstraint cc(*compiled, vocab);
  auto mask = cc.Mask(gr.initial());
  for (int32_t id = 1; id < vocab->size(); ++id) {
    const bool live = !gr.AdvanceAll(gr.initial(), vocab->bytes(id)).dead();
    Check(g::MaskAllows(*mask, id) == live, "mask agrees with the automaton");
  }
  return 0;
}
