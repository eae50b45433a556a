// Step plan / step result serialization: lossless round trips with every field
// set, and DataLoss (never a crash or a huge allocation) on truncated, corrupt
// or over-long input.
#include "distributed/step_plan_codec.h"

#include <cstring>
#include <random>
#include <string>

#include <gtest/gtest.h>

namespace pagedserve {
namespace {

SamplingParams FullSampling(int salt) {
  SamplingParams s;
  s.n = 3 + salt;
  s.max_tokens = 77 + salt;
  s.temperature = 0.7f;
  s.top_p = 0.9f;
  s.top_k = 40;
  s.min_p = 0.05f;
  s.repetition_penalty = 1.1f;
  s.presence_penalty = 0.25f;
  s.frequency_penalty = -0.5f;
  s.seed = 0xDEADBEEFCAFEull + salt;
  s.stop = {"\n\n", "END", std::string("a\0b", 3)};
  s.stop_token_ids = {2, 49152 + salt};
  s.ignore_eos = true;
  s.logprobs = 5;
  s.prompt_logprobs = 3 + salt;
  s.structured_output = {StructuredOutput::Kind::kJsonSchema,
                         std::string("{\"type\":\"string\"}\0", 18) + std::to_string(salt)};
  s.logit_bias = {{7, -100.0f}, {11 + salt, 2.5f}};
  s.min_tokens = 4;
  s.min_tokens_end_ids = {2, 3};
  s.bad_words_token_ids = {{5}, {6, 8 + salt, 9}};
  return s;
}

StepPlan FullPlan() {
  StepPlan p;
  p.step_id = 0x123456789ABCull;
  for (int i = 0; i < 3; ++i) {
    SequenceStep s;
    s.seq_id = 1000 + i;
    s.fork_from = i == 1 ? 1000 : kNoSeq;
    s.token_ids = {i, 10 + i, 20 + i};
    s.start_pos = 5 * i;
    s.block_table_start = i == 2 ? 4 : 0;  // seq 1002 continues: a block-table tail
    s.block_table = {7 * i, 7 * i + 1, 7 * i + 2};
    s.sample = i != 2;
    s.num_samples = i + 1;
    if (i == 0) {  // a verification: 2 of its 3 fed tokens are drafts
      s.num_samples = 1;
      s.num_draft_tokens = 2;
    }
    if (i == 2) {  // a prefill chunk scoring its prompt tokens
      s.prompt_logprobs = true;
      s.next_prompt_token = 77;
    }
    s.sample_index = i;
    s.sampling = FullSampling(i);
    s.num_prompt_tokens = 4 + i;
    s.new_state = i == 0;
    s.cached_prefix_token_ids = {9, 8, 7, i};
    if (!s.starts()) {  // a continuing sequence has no per-sequence constants
      s.sample_index = 0;
      s.sampling = SamplingParams{};
      s.num_prompt_tokens = 0;
      s.cached_prefix_token_ids.clear();
    }
    p.seqs.push_back(s);
  }
  p.swap_out = {{1, 2}, {3, 4}};
  p.swap_in = {{5, 6}};
  p.copy = {{7, 8}, {9, 10}, {11, 12}};
  p.finished = {1, 2, 3, 0xFFFFFFFFFFull};
  p.shutdown = true;
  return p;
}

StepResult FullResult() {
  StepResult r;
  r.step_id = 99;
  for (int i = 0; i < 3; ++i) {
    SampledToken t;
    t.seq_id = 500 + i;
    t.token_id = 1234 + i;
    t.logprob = -0.125f * (i + 1);
    t.top_token_ids = {1, 2, i};
    t.top_logprobs = {-0.1f, -0.2f, -0.3f};
    r.tokens.push_back(t);
    PromptLogprob p;
    p.seq_id = 600 + i;
    p.position = 3 + i;
    p.token_id = 42 + i;
    p.logprob = -1.5f * (i + 1);
    p.rank = 7 + i;
    p.top_token_ids = {4, 5, i};
    p.top_logprobs = {-0.5f, -0.75f, -1.0f};
    if (i == 1) p.top_token_ids.clear(), p.top_logprobs.clear();  // prompt_logprobs 0
    r.prompt_logprobs.push_back(p);
  }
  r.failed.push_back({501, "sampler row 1 (seq 501): logit of token 3 is nan"});
  r.failed.push_back({502, ""});
  r.drafts.push_back({501, {7, 8, 9}});
  r.drafts.push_back({503, {}});
  r.forward_seconds = 0.0123;
  r.collective_seconds = 0.00456;
  return r;
}

void ExpectSamplingEq(const SamplingParams& a, const SamplingParams& b) {
  EXPECT_EQ(a.n, b.n);
  EXPECT_EQ(a.max_tokens, b.max_tokens);
  EXPECT_EQ(a.temperature, b.temperature);
  EXPECT_EQ(a.top_p, b.top_p);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.min_p, b.min_p);
  EXPECT_EQ(a.repetition_penalty, b.repetition_penalty);
  EXPECT_EQ(a.presence_penalty, b.presence_penalty);
  EXPECT_EQ(a.frequency_penalty, b.frequency_penalty);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.stop, b.stop);
  EXPECT_EQ(a.stop_token_ids, b.stop_token_ids);
  EXPECT_EQ(a.ignore_eos, b.ignore_eos);
  EXPECT_EQ(a.logprobs, b.logprobs);
  EXPECT_EQ(a.prompt_logprobs, b.prompt_logprobs);
  EXPECT_EQ(a.structured_output, b.structured_output);
  EXPECT_EQ(a.logit_bias, b.logit_bias);
  EXPECT_EQ(a.min_tokens, b.min_tokens);
  EXPECT_EQ(a.min_tokens_end_ids, b.min_tokens_end_ids);
  EXPECT_EQ(a.bad_words_token_ids, b.bad_words_token_ids);
}

void ExpectPlanEq(const StepPlan& a, const StepPlan& b) {
  EXPECT_EQ(a.step_id, b.step_id);
  ASSERT_EQ(a.seqs.size(), b.seqs.size());
  for (size_t i = 0; i < a.seqs.size(); ++i) {
    SCOPED_TRACE(i);
    const SequenceStep& x = a.seqs[i];
    const SequenceStep& y = b.seqs[i];
    EXPECT_EQ(x.seq_id, y.seq_id);
    EXPECT_EQ(x.fork_from, y.fork_from);
    EXPECT_EQ(x.token_ids, y.token_ids);
    EXPECT_EQ(x.start_pos, y.start_pos);
    EXPECT_EQ(x.block_table_start, y.block_table_start);
    EXPECT_EQ(x.block_table, y.block_table);
    EXPECT_EQ(x.sample, y.sample);
    EXPECT_EQ(x.num_samples, y.num_samples);
    EXPECT_EQ(x.num_draft_tokens, y.num_draft_tokens);
    EXPECT_EQ(x.prompt_logprobs, y.prompt_logprobs);
    EXPECT_EQ(x.next_prompt_token, y.next_prompt_token);
    EXPECT_EQ(x.sample_index, y.sample_index);
    ExpectSamplingEq(x.sampling, y.sampling);
    EXPECT_EQ(x.num_prompt_tokens, y.num_prompt_tokens);
    EXPECT_EQ(x.new_state, y.new_state);
    EXPECT_EQ(x.cached_prefix_token_ids, y.cached_prefix_token_ids);
  }
  EXPECT_EQ(a.swap_out, b.swap_out);
  EXPECT_EQ(a.swap_in, b.swap_in);
  EXPECT_EQ(a.copy, b.copy);
  EXPECT_EQ(a.finished, b.finished);
  EXPECT_EQ(a.shutdown, b.shutdown);
}

TEST(StepPlanCodec, RoundTripEveryField) {
  const StepPlan plan = FullPlan();
  absl::StatusOr<StepPlan> back = DecodeStepPlan(EncodeStepPlan(plan));
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectPlanEq(plan, *back);
}

TEST(StepPlanCodec, RoundTripDefaultsAndEmpty) {
  StepPlan plan;  // no sequences, no seed, shutdown false
  absl::StatusOr<StepPlan> back = DecodeStepPlan(EncodeStepPlan(plan));
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectPlanEq(plan, *back);
  StepPlan one;
  one.seqs.emplace_back();  // default SequenceStep: seed unset, fork_from kNoSeq
  back = DecodeStepPlan(EncodeStepPlan(one));
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectPlanEq(one, *back);
  EXPECT_FALSE(back->seqs[0].sampling.seed.has_value());
}

// Plans are incremental on the wire: a continuing sequence's entry carries no
// sampling parameters (nor the other per-sequence constants), so a decode
// costs a fixed, small number of bytes however long its block table is.
TEST(StepPlanCodec, ContinuingSequencesSendOnlyWhatChanged) {
  StepPlan base;
  const size_t empty = EncodeStepPlan(base).size();
  SequenceStep decode;
  decode.seq_id = 7;
  decode.token_ids = {42};
  decode.start_pos = 300;
  decode.block_table_start = 19;      // unchanged row of 19 blocks
  decode.sampling = FullSampling(0);  // set but not sent: not a start
  decode.sample_index = 2;
  StepPlan plan = base;
  plan.seqs.push_back(decode);
  const std::string bytes = EncodeStepPlan(plan);
  // id 8, flags 1, tokens 8 + 4, start_pos 4, block_table_start 4, block_table 8,
  // num_samples 4.
  EXPECT_EQ(bytes.size() - empty, 41u);
  absl::StatusOr<StepPlan> back = DecodeStepPlan(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->seqs[0].block_table_start, 19);
  EXPECT_TRUE(back->seqs[0].block_table.empty());
  EXPECT_EQ(back->seqs[0].sample_index, 0);  // constants are not sent for a continuing sequence
  EXPECT_EQ(back->seqs[0].sampling.temperature, SamplingParams{}.temperature);
  // The same sequence starting (new_state) carries everything.
  plan.seqs[0].new_state = true;
  back = DecodeStepPlan(EncodeStepPlan(plan));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->seqs[0].sample_index, 2);
  ExpectSamplingEq(back->seqs[0].sampling, FullSampling(0));
}

TEST(StepPlanCodec, UnknownSequenceFlagsAreDataLoss) {
  StepPlan plan;
  plan.seqs.emplace_back();
  std::string bytes = EncodeStepPlan(plan);
  // Layout: magic(4) step_id(8) seqs.size(8) seq_id(8) flags(1).
  bytes[28] = static_cast<char>(0x80);
  absl::StatusOr<StepPlan> p = DecodeStepPlan(bytes);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(p.status().message().find("flags"), std::string::npos) << p.status();
}

TEST(StepResultCodec, RoundTripEveryField) {
  const StepResult r = FullResult();
  absl::StatusOr<StepResult> back = DecodeStepResult(EncodeStepResult(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->step_id, r.step_id);
  ASSERT_EQ(back->tokens.size(), r.tokens.size());
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    EXPECT_EQ(back->tokens[i].seq_id, r.tokens[i].seq_id);
    EXPECT_EQ(back->tokens[i].token_id, r.tokens[i].token_id);
    EXPECT_EQ(back->tokens[i].logprob, r.tokens[i].logprob);
    EXPECT_EQ(back->tokens[i].top_token_ids, r.tokens[i].top_token_ids);
    EXPECT_EQ(back->tokens[i].top_logprobs, r.tokens[i].top_logprobs);
  }
  EXPECT_EQ(back->prompt_logprobs, r.prompt_logprobs);
  EXPECT_EQ(back->failed, r.failed);
  EXPECT_EQ(back->drafts, r.drafts);
  EXPECT_EQ(back->forward_seconds, r.forward_seconds);
  EXPECT_EQ(back->collective_seconds, r.collective_seconds);
}

TEST(StepPlanCodec, EveryTruncationIsDataLoss) {
  const std::string bytes = EncodeStepPlan(FullPlan());
  for (size_t len = 0; len < bytes.size(); ++len) {
    // A fresh buffer of exactly `len` bytes so that ASan sees any overread.
    std::string cut = bytes.substr(0, len);
    absl::StatusOr<StepPlan> p = DecodeStepPlan(cut);
    ASSERT_FALSE(p.ok()) << "decoded a plan from " << len << " of " << bytes.size() << " bytes";
    EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss) << len << ": " << p.status();
  }
}

TEST(StepResultCodec, EveryTruncationIsDataLoss) {
  const std::string bytes = EncodeStepResult(FullResult());
  for (size_t len = 0; len < bytes.size(); ++len) {
    std::string cut = bytes.substr(0, len);
    absl::StatusOr<StepResult> r = DecodeStepResult(cut);
    ASSERT_FALSE(r.ok()) << len;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << len << ": " << r.status();
  }
}

TEST(StepPlanCodec, TrailingBytesAndBadMagic) {
  std::string bytes = EncodeStepPlan(FullPlan());
  absl::StatusOr<StepPlan> p = DecodeStepPlan(bytes + "x");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(p.status().message().find("trailing"), std::string::npos) << p.status();

  std::string bad = bytes;
  bad[0] = 'X';
  p = DecodeStepPlan(bad);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(p.status().message().find("magic"), std::string::npos) << p.status();

  // A result is not a plan and vice versa.
  EXPECT_EQ(DecodeStepPlan(EncodeStepResult(FullResult())).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeStepResult(EncodeStepPlan(FullPlan())).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(StepPlanCodec, HugeLengthPrefixIsRejectedWithoutAllocating) {
  // magic + step_id + seqs.size = 2^63: must fail on the count check, not
  // try to allocate.
  std::string bytes = "PSP4";
  uint64_t step = 1, n = uint64_t{1} << 63;
  bytes.append(reinterpret_cast<const char*>(&step), 8);
  bytes.append(reinterpret_cast<const char*>(&n), 8);
  absl::StatusOr<StepPlan> p = DecodeStepPlan(bytes);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(p.status().message().find("seqs"), std::string::npos) << p.status();

  // The same for a vector length inside the plan: swap_out of an empty plan.
  std::string empty = EncodeStepPlan(StepPlan{});
  // Layout: magic(4) step_id(8) seqs.size(8) swap_out.size(8) ...
  std::memcpy(empty.data() + 20, &n, 8);
  p = DecodeStepPlan(empty);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("swap_out"), std::string::npos) << p.status();
}

TEST(StepPlanCodec, RandomCorruptionNeverCrashes) {
  const std::string plan_bytes = EncodeStepPlan(FullPlan());
  const std::string result_bytes = EncodeStepResult(FullResult());
  std::mt19937_64 rng(1234);
  int plan_errors = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string p = plan_bytes, r = result_bytes;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      p[rng() % p.size()] = static_cast<char>(rng());
      r[rng() % r.size()] = static_cast<char>(rng());
    }
    absl::StatusOr<StepPlan> dp = DecodeStepPlan(p);
    absl::StatusOr<StepResult> dr = DecodeStepResult(r);
    // Either a plan (the flips hit plain values) or DataLoss; never another code.
    if (!dp.ok()) {
      ++plan_errors;
      EXPECT_EQ(dp.status().code(), absl::StatusCode::kDataLoss);
    }
    if (!dr.ok()) {
      EXPECT_EQ(dr.status().code(), absl::StatusCode::kDataLoss);
    }
  }
  // Length and magic bytes are hit often enough that many inputs must fail.
  EXPECT_GT(plan_errors, 100);
}

}  // namespace
}  // namespace pagedserve
