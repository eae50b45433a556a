// Limits on client JSON checked on the raw text, before any parser sees it: the
// same on every front end (HTTP / OpenAI, ZeroMQ protocol v1, `/tokenize`), so
// that no request can make the server recurse, allocate or loop without bound.
//
// Why before parsing: nlohmann's parser is iterative, but a parsed value's copy
// and serialization recurse once per nesting level, so a 400 KB body nested
// 200,000 levels deep overflowed a handler thread's stack. With the depth
// bounded here, every later walk over the value is shallow. The body-size
// limit itself is the transport's (HTTP 413, protocol `message_too_large`),
// applied before the text is even read whole; max_string_bytes and
// max_array_elements bound single values below it.
#ifndef PAGEDSERVE_RUNTIME_COMMON_JSON_LIMITS_H_
#define PAGEDSERVE_RUNTIME_COMMON_JSON_LIMITS_H_

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"

namespace pagedserve {

struct JsonLimits {
  // Objects and arrays open at once. OpenAI requests nest at most ~8 levels
  // (chat message -> content part -> image_url; tool JSON schemas a few more).
  int max_depth = 32;
  // Bytes of one string literal as written (escapes counted as written).
  size_t max_string_bytes = size_t{1} << 20;
  // Elements of one array (a prompt of token ids, a batch of prompts, messages).
  size_t max_array_elements = size_t{1} << 18;
  // Members of one object. Readers that keep the client's key order
  // (nlohmann::ordered_json: tool schemas, chat_template_kwargs) insert each
  // key by a linear scan, quadratic in an object's size; 4096 is far above
  // what requests hold (logit_bias: at most 1,024 entries) and bounds that.
  size_t max_object_members = 4096;
};

// Scans `text` once (no recursion, no allocation) and checks it against
// `limits`. Not a validator: malformed JSON within the limits passes here and
// is the parser's to report. Strings (with backslash escapes) are skipped when
// counting nesting and elements. Returns InvalidArgument naming the limit and
// the byte offset at which it was crossed, e.g. "JSON nests deeper than 32
// levels (at byte 33)". Thread-safe (pure function).
absl::Status CheckJsonText(std::string_view text, const JsonLimits& limits = {});

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_COMMON_JSON_LIMITS_H_
