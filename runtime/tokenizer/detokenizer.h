// Incremental detokenization for streaming, one instance per sequence.
//
// Add(id) returns the text that token adds to the output. Bytes of a character
// that is split across tokens (byte tokens, pieces of an emoji) are held back
// until the character is complete, so no delta ever contains a broken UTF-8
// sequence; a byte sequence that can no longer become valid is emitted as
// U+FFFD, exactly as Tokenizer::Decode does. Finish() flushes what is held back
// (an incomplete tail becomes U+FFFD). Contract: the concatenation of all
// deltas and Finish() equals Tokenizer::Decode(all ids, same options); no text
// is repeated or dropped at chunk boundaries. The Tokenizer must outlive it.
#ifndef PAGEDSERVE_RUNTIME_TOKENIZER_DETOKENIZER_H_
#define PAGEDSERVE_RUNTIME_TOKENIZER_DETOKENIZER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/tokenizer/tokenizer.h"

namespace pagedserve {

class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, DecodeOptions options = {});

  // The new text (possibly empty). InvalidArgument for an id out of range (the
  // state is then unchanged).
  absl::StatusOr<std::string> Add(int32_t id);
  // Ends the sequence: returns the held-back bytes, invalid ones as U+FFFD.
  std::string Finish();

  // All text returned so far (deltas and Finish).
  const std::string& text() const { return text_; }
  // Bytes held back because they may be the start of an incomplete character.
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  DecodeOptions options_;
  bool any_bytes_ = false;  // a token has produced bytes (leading-space rule)
  std::string pending_;
  std::string text_;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_TOKENIZER_DETOKENIZER_H_
