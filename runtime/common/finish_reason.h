// Why a sequence ended: the one finish-reason type from the scheduler through
// the engine to both front ends (ZeroMQ protocol, OpenAI HTTP API) and the
// metrics label. The wire form is FinishReasonName().
#ifndef PAGEDSERVE_RUNTIME_COMMON_FINISH_REASON_H_
#define PAGEDSERVE_RUNTIME_COMMON_FINISH_REASON_H_

#include <string_view>

namespace pagedserve {

enum class FinishReason {
  kNone,    // still running
  kStop,    // EOS, a stop token id, or a stop string
  kLength,  // max_tokens or max_model_len reached
  kAbort,   // aborted by the client, a disconnect or the shutdown
  kError,   // the request failed inside the server
};

// "stop", "length", "abort", "error"; "" for kNone.
inline std::string_view FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
    case FinishReason::kNone: break;
  }
  return "";
}

// The one rule for a sequence whose reason the engine did not report before
// its request's final output (the sequence ended with the request): kError
// when the request failed (`request_failed`: the final output carries an
// error), else kAbort (an abort by the client or a disconnect, the shutdown).
// A reported reason stands. Every front end applies it.
inline FinishReason EndedWithRequest(FinishReason reported, bool request_failed) {
  if (reported != FinishReason::kNone) return reported;
  return request_failed ? FinishReason::kError : FinishReason::kAbort;
}

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_COMMON_FINISH_REASON_H_
