// One fuzz iteration over each model-file loader, shared by the libFuzzer
// targets (fuzz_gguf.cc, fuzz_safetensors.cc, fuzz_hf_config.cc,
// fuzz_hf_tokenizer.cc; built with clang and -DPAGEDSERVE_FUZZ=ON, run by
// scripts/fuzz) and the GTest that replays the committed seed corpora
// (tests/model/corpus/<target>/) in every build.
//
// Each function feeds `data` to the loader as a whole file held in memory (the
// loaders' FromBytes / *FromHfJson entry points; nothing is written to disk)
// and returns "" when every invariant holds, else a description of the
// violation. Sanitizer reports and crashes are the fuzzer's to catch; these
// functions check what a sanitizer cannot see. Not thread-safe (no shared state,
// but meant for one fuzz iteration at a time).
#ifndef PAGEDSERVE_TESTS_MODEL_LOADER_FUZZ_ENTRY_H_
#define PAGEDSERVE_TESTS_MODEL_LOADER_FUZZ_ENTRY_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace pagedserve {

// GgufFile::FromBytes("fuzz.gguf", data). Rejected: the error is
// InvalidArgument and its message starts with "fuzz.gguf: " and names a field.
// Accepted: every tensor has 1..4 dims >= 1, num_elements = product(dims), a
// row length that is a multiple of its type's block size, size_bytes and
// row_bytes from the block geometry, an aligned data offset inside the file
// and TensorData() lying inside the input; names and metadata keys resolve
// through FindTensor / Find. Every dequantizable tensor (up to a bounded
// element count) converts to fp32 with DequantizeRows, and out-of-range rows
// are rejected. Then ModelConfigFromGguf and TokenizerSpecFromGguf run on the
// parsed file (errors must name the file; an accepted config validates). With
// an accepted config the input is also loaded the way the server loads a model,
// LoadLlamaWeights over an in-memory file (memfd; fp32 at tensor-parallel size
// 1, stored formats as rank 1 of 2): a rejection names the file, an accepted
// model has the config's layers and shapes and every matrix row converts to
// fp32. An accepted tokenizer spec goes through Tokenizer::Create and a few
// Encode / Decode calls (ids in range, Decode succeeds).
std::string GgufFuzzOneInput(const uint8_t* data, size_t size);

// SafetensorsFile::FromBytes("fuzz.safetensors", data). Rejected:
// InvalidArgument starting with "fuzz.safetensors: ". Accepted: each tensor has
// a known dtype, non-negative shape, num_elements = product(shape), size_bytes =
// num_elements x dtype size, bytes inside the data section (after the 8 + N
// byte header), Find(name) returns it; ReadRows of F32/F16/BF16 tensors
// succeeds over all rows (bounded) and rejects rows past the end.
std::string SafetensorsFuzzOneInput(const uint8_t* data, size_t size);

// ModelConfigFromHfJson(data, "fuzz/config.json"). Rejected: InvalidArgument or
// Unimplemented naming "fuzz/config.json". Accepted: Validate() passes and the
// rotary inverse frequencies are finite and positive.
std::string HfConfigFuzzOneInput(const uint8_t* data, size_t size);

// TokenizerSpecFromHfJson(tokenizer.json, tokenizer_config.json) where the
// input is split at its first NUL byte (JSON text has none): the bytes before
// are tokenizer.json, the bytes after tokenizer_config.json (absent without a
// NUL). Rejected: the message starts with "tokenizer.json: " or
// "tokenizer_config.json: ". Accepted: Tokenizer::Create, and when that
// succeeds a few Encode / Decode calls (ids in range, Decode succeeds).
std::string HfTokenizerFuzzOneInput(const uint8_t* data, size_t size);

}  // namespace pagedserve

#endif  // PAGEDSERVE_TESTS_MODEL_LOADER_FUZZ_ENTRY_H_
