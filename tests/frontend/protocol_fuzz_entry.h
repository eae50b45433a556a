// One fuzz iteration over the request parser, shared by the libFuzzer target
// (fuzz_protocol.cc) and the GTest that replays the seed corpus (corpus/).
#ifndef PAGEDSERVE_TESTS_FRONTEND_PROTOCOL_FUZZ_ENTRY_H_
#define PAGEDSERVE_TESTS_FRONTEND_PROTOCOL_FUZZ_ENTRY_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace pagedserve::protocol {

// Parses `data` as a client message and checks the invariants:
//  - parsing returns (no throw, no crash, sanitizers quiet);
//  - an accepted request serializes to JSON that parses back to an equal request;
//  - a rejected one yields an error reply whose serialization parses back (as a
//    reply) to an equal ErrorReply, with a non-empty message.
// Returns "" when every invariant holds, else a description of the violation.
std::string ProtocolFuzzOneInput(const uint8_t* data, size_t size);

}  // namespace pagedserve::protocol

#endif  // PAGEDSERVE_TESTS_FRONTEND_PROTOCOL_FUZZ_ENTRY_H_
