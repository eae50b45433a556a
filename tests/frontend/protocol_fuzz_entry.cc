#include "tests/frontend/protocol_fuzz_entry.h"

#include <string_view>
#include <variant>

#include "runtime/frontend/protocol.h"

namespace pagedserve::protocol {

std::string ProtocolFuzzOneInput(const uint8_t* data, size_t size) {
  ParseOptions options;
  options.max_message_bytes = 64 * 1024;
  options.vocab_size = 49152;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  ParseResult parsed = ParseRequest(bytes, options);
  if (parsed.ok()) {
    const std::string wire = SerializeRequest(*parsed.request);
    ParseOptions relaxed = options;
    relaxed.max_message_bytes = wire.size() + 1;
    ParseResult again = ParseRequest(wire, relaxed);
    if (!again.ok())
      return "re-parse of a serialized request failed: " + again.error.message + "\n" + wire;
    if (!(*again.request == *parsed.request)) return "request changed in a round trip:\n" + wire;
    return "";
  }
  if (parsed.error.message.empty()) return "error reply without a message";
  const std::string wire = SerializeReply(parsed.error);
  auto reply = ParseReply(wire);
  if (!reply.ok())
    return "error reply does not parse back: " + std::string(reply.status().message()) + "\n" +
           wire;
  const auto* err = std::get_if<ErrorReply>(&*reply);
  if (err == nullptr || !(*err == parsed.error))
    return "error reply changed in a round trip:\n" + wire;
  return "";
}

}  // namespace pagedserve::protocol
