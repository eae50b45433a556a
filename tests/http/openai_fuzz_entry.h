// One fuzz iteration over the HTTP API's request path after the transport:
// body bytes -> limits (json_limits.h) -> JSON -> validated request -> chat
// template render -> tokens, for every route that takes a JSON body. Shared by
// the libFuzzer target (fuzz_openai.cc) and the GTest that replays the seed
// corpus (corpus/). The HTTP framing before it is Boost.Beast's request_parser
// (runtime/frontend/http_server.cc); http_server_test covers its edge cases.
#ifndef PAGEDSERVE_TESTS_HTTP_OPENAI_FUZZ_ENTRY_H_
#define PAGEDSERVE_TESTS_HTTP_OPENAI_FUZZ_ENTRY_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace pagedserve::openai {

// The first byte picks the route (mod 4: /v1/completions, /v1/chat/completions,
// /tokenize, /detokenize); the rest is the request body. Checks:
//  - the call returns (no throw, no crash, sanitizers quiet);
//  - an accepted generation request has 1..N non-empty prompts of ids below
//    the vocabulary size and sampling parameters that SamplingParams::Validate
//    accepts (prompt length against max_model_len is admission's, later);
//  - a refusal is a 400 or 404 with a non-empty message, and its error body
//    is one JSON object;
//  - a tokenize / detokenize answer is one JSON object.
// The tokenizer and chat template are the SmolLM2 fixture's
// ($PAGEDSERVE_SOURCE_DIR/tests/fixtures/smollm2-tokenizer; the source tree is
// "." when unset), loaded once. Returns "" when every invariant holds, else a
// description of the violation.
std::string OpenAiFuzzOneInput(const uint8_t* data, size_t size);

}  // namespace pagedserve::openai

#endif  // PAGEDSERVE_TESTS_HTTP_OPENAI_FUZZ_ENTRY_H_
