#include "runtime/tokenizer/detokenizer.h"

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace pagedserve {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, DecodeOptions options)
    : tokenizer_(tokenizer), options_(options) {}

absl::StatusOr<std::string> IncrementalDetokenizer::Add(int32_t id) {
  if (id < 0 || id >= tokenizer_.vocab_size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "token id %d is outside the vocabulary of %d tokens", id, tokenizer_.vocab_size()));
  }
  std::string bytes = tokenizer_.TokenBytes(id, !any_bytes_, options_);
  if (bytes.empty()) return std::string();
  any_bytes_ = true;
  pending_ += bytes;
  size_t consumed = 0;
  std::string delta = SanitizeUtf8(pending_, /*final=*/false, &consumed);
  pending_.erase(0, consumed);
  text_ += delta;
  return delta;
}

std::string IncrementalDetokenizer::Finish() {
  std::string delta = SanitizeUtf8(pending_, /*final=*/true);
  pending_.clear();
  text_ += delta;
  return delta;
}

}  // namespace pagedserve
