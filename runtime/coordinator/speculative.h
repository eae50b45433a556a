// Speculative decoding on the coordinator side: the configuration
// (--speculative-config, vLLM's JSON), the Proposer seam, the n-gram
// prompt-lookup proposer and the placeholder proposer of a draft model (which
// runs on the workers: runtime/worker/draft_model.h).
//
// How a speculative step works (Leviathan et al. 2023, "Fast Inference from
// Transformers via Speculative Decoding"; Chen et al. 2023, "Accelerating
// Large Language Model Decoding with Speculative Sampling"):
//   1. a Proposer drafts up to k tokens d_1..d_k after a decoding sequence's
//      last token t: from the sequence's own tokens (n-gram lookup), or as k
//      placeholders that the workers' draft model fills in the same step,
//      greedily, before the target verifies them (StepResult::drafts brings
//      them back; acceptance then reads them);
//   2. the scheduler feeds [t, d_1..d_k] in one step (k + 1 query tokens over
//      the paged cache, like a prompt chunk; the step budget counts all of
//      them) and asks the workers for the target's sample at each of the k + 1
//      positions (SequenceStep::num_draft_tokens);
//   3. acceptance (AcceptedDraftLength): the longest prefix of the draft that
//      equals the target's samples, then the target's next sample. So a step
//      emits 1..k+1 tokens, and the target's sample at the first rejected
//      position replaces the draft token there.
// Why this is exact for sampling too: an n-gram draft, and a greedy draft
// model's argmax, is a point mass q = δ_x.
// The rejection rule accepts x with probability min(1, p(x) / q(x)) = p(x)
// and otherwise samples from norm(max(0, p - q)) = p with x removed,
// renormalized. Drawing y ~ p (the sampler, with every penalty and filter of
// the request, from the history that includes the accepted drafts) and
// accepting iff y == x has exactly that law: P(accept) = p(x), and y given
// y != x is p restricted to the other tokens. Seeded rows draw y with the
// uniform keyed by (seed, sample_index, position) as without speculation, so
// a seeded request gives the same tokens with and without speculation (and
// with any k, batch or preemption), and logprobs are the target's.
//
// Not thread-safe; the scheduler owns its proposer.
#ifndef PAGEDSERVE_RUNTIME_COORDINATOR_SPECULATIVE_H_
#define PAGEDSERVE_RUNTIME_COORDINATOR_SPECULATIVE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/common/step_plan.h"

namespace pagedserve {

// --speculative-config, as vLLM's SpeculativeConfig (the fields we take).
struct SpeculativeConfig {
  // "ngram" (prompt lookup), "draft_model" (a smaller model of the same
  // vocabulary, `model`) or empty (speculation off). vLLM's "[ngram]" is
  // also accepted as "ngram".
  std::string method;
  // The draft model's path (.gguf or Hugging Face folder) for "draft_model".
  // Workers load it beside the target (WorkerOptions::draft_model_path).
  std::string model;
  // Most draft tokens per sequence and step (k), 1..16.
  int32_t num_speculative_tokens = 0;
  // "ngram" only: the n-gram lengths tried, longest first: prompt_lookup_max
  // down to prompt_lookup_min, 1 <= min <= max <= 16. When omitted: neither
  // given, [1, 4]; only min given, max = min; only max given, min = 1.
  int32_t prompt_lookup_max = 0;
  int32_t prompt_lookup_min = 0;
  // Back-off under load (vLLM's speculative_disable_by_batch_size): no
  // sequence speculates in a step whose running sequences number at least
  // this many (0 = never disabled). Default 0.
  int32_t disable_by_batch_size = 0;

  bool enabled() const { return !method.empty() && num_speculative_tokens > 0; }
  // InvalidArgument naming the field for a value out of range.
  absl::Status Validate() const;
};

// Parses the JSON object of --speculative-config: keys "method" (required
// unless "model" is given, which implies "draft_model"), "model",
// "num_speculative_tokens" (required), "prompt_lookup_max",
// "prompt_lookup_min" (ngram only), "disable_by_batch_size". Unknown keys,
// wrong types and out-of-range values are InvalidArgument errors naming the
// key. An empty string means speculation off. Whether the model loads, and
// shares the target's vocabulary, is the workers' check (Worker::Create).
absl::StatusOr<SpeculativeConfig> ParseSpeculativeConfig(std::string_view json);

// The draft seam: anything that proposes the next tokens of a sequence from
// its tokens (prompt + generated, all verified). A draft model, EAGLE heads or
// MTP layers would implement it on the workers' side of a step and return
// their drafts here; the scheduler only needs the proposed ids.
class Proposer {
 public:
  virtual ~Proposer() = default;
  // Writes up to max_tokens draft tokens following `tokens` into *draft
  // (cleared first; empty when there is nothing to propose).
  virtual void Propose(std::span<const int32_t> tokens, int32_t max_tokens,
                       std::vector<int32_t>* draft) = 0;
};

// Prompt lookup decoding (Saxena 2023; vLLM's ngram proposer, llama.cpp's
// lookup decoding): for n = prompt_lookup_max down to prompt_lookup_min, find
// the first occurrence of the sequence's last n tokens in its own tokens
// (prompt and output), other than the tail itself; the first n with a match
// proposes the tokens that followed that occurrence (at most max_tokens,
// fewer near the end).
// Cost O(len * n) per call, no allocation after the first.
class NgramProposer : public Proposer {
 public:
  NgramProposer(int32_t min_n, int32_t max_n) : min_n_(min_n), max_n_(max_n) {}
  void Propose(std::span<const int32_t> tokens, int32_t max_tokens,
               std::vector<int32_t>* draft) override;

 private:
  int32_t min_n_, max_n_;
};

// A draft model's coordinator side: max_tokens placeholders (kNoToken) that
// the workers' draft model replaces in the step that verifies them
// (SequenceStep::num_draft_tokens); the scheduler reads the proposed tokens
// from StepResult::drafts.
class DraftModelProposer : public Proposer {
 public:
  void Propose(std::span<const int32_t> tokens, int32_t max_tokens,
               std::vector<int32_t>* draft) override;
};

// The proposer a config asks for (nullptr when speculation is off).
std::unique_ptr<Proposer> MakeProposer(const SpeculativeConfig& config);

// Greedy-compatible acceptance: the number of leading draft tokens equal to
// the target's samples at the same positions (target[i] is the target's
// sample after the fed token i, so draft[i] is checked against target[i]).
// The step then emits target[0..accepted], i.e. accepted + 1 tokens.
int32_t AcceptedDraftLength(std::span<const int32_t> draft, std::span<const int32_t> target);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_COORDINATOR_SPECULATIVE_H_
