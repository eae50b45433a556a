// Conversion of ggml tensor data (GGUF) and safetensors dtypes to fp32.
//
// Block formats are those of ggml (ggml-common.h / ggml-quants.c): legacy
// 32-element blocks Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, 256-element K-quant
// super-blocks Q2_K..Q6_K, IQ4_NL (32) and IQ4_XS (256), all with fp16 scales.
// Results match gguf-py's gguf.quants.dequantize (checked by
// tests/model/dequant_test.cc against fixtures from
// tests/model/make_dequant_fixtures.py) to within fp32 rounding. Every format
// here is one the Linear kernels run (kernels/weight_format.h), converted by
// kernels::DequantizeRowToFloat, where the block layouts are defined.
#ifndef PAGEDSERVE_RUNTIME_MODEL_DEQUANT_H_
#define PAGEDSERVE_RUNTIME_MODEL_DEQUANT_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "runtime/model/gguf.h"

namespace pagedserve {

// IEEE 754 binary16 -> fp32 (exact; subnormals, inf and NaN preserved).
float Fp16ToFp32(uint16_t h);
// bfloat16 -> fp32 (exact: the upper 16 bits of an fp32).
float Bf16ToFp32(uint16_t b);

// True for the types DequantizeRow accepts: F32, F16, BF16, Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS.
bool CanDequantize(GgmlType type);

// Converts `n` consecutive elements stored as `type` in `src` to fp32 in
// dst[0..n). n must be a multiple of the type's block size and src must hold
// exactly n / block_elements * block_bytes bytes. InvalidArgument (naming the
// type and the sizes) otherwise, Unimplemented for a type CanDequantize rejects.
absl::Status DequantizeRow(GgmlType type, std::span<const uint8_t> src, float* dst, size_t n);

// Dequantizes rows [row_begin, row_end) of tensor `info` whose bytes are
// `data` (GgufFile::TensorData). A row is dims[0] elements; the result is
// row-major [(row_end - row_begin), dims[0]] in dst. Only the bytes of those
// rows are read, so a tensor-parallel shard of rows costs only its share.
absl::Status DequantizeRows(const GgufTensorInfo& info, std::span<const uint8_t> data,
                            uint64_t row_begin, uint64_t row_end, float* dst);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_MODEL_DEQUANT_H_
