// One fuzz iteration of the chat template engine (runtime/chat), shared by the
// libFuzzer target fuzz_chat_template (fuzz_chat_template.cc; clang and
// -DPAGEDSERVE_FUZZ=ON, run by scripts/fuzz chat_template) and the GTest that
// replays the committed seeds (tests/chat/corpus/) in every build.
#ifndef PAGEDSERVE_TESTS_CHAT_CHAT_FUZZ_ENTRY_H_
#define PAGEDSERVE_TESTS_CHAT_CHAT_FUZZ_ENTRY_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace pagedserve::chat {

// The input is split at its first NUL byte: the bytes before are the template,
// the bytes after a JSON object of variables (messages, tools,
// add_generation_prompt ...; a default conversation when absent, invalid or
// beyond the front ends' JSON limits). The template is parsed and, when
// accepted, rendered twice under small RenderLimits with a fixed clock.
// Returns "" when every invariant holds, else what was violated:
//  - an error is InvalidArgument, Unimplemented, ResourceExhausted or
//    FailedPrecondition with a message, never another code;
//  - a rendered text fits the output limit;
//  - both renders give the same text or the same error (no state leaks
//    between renders, nothing depends on memory addresses).
// Time and memory are the limits' to bound (libFuzzer's -timeout and
// -rss_limit_mb catch a hang or a blow-up).
std::string ChatTemplateFuzzOneInput(const uint8_t* data, size_t size);

}  // namespace pagedserve::chat

#endif  // PAGEDSERVE_TESTS_CHAT_CHAT_FUZZ_ENTRY_H_
