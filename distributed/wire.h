// Little binary writer/reader used for the step plan and step result on the
// wire between the coordinator and worker ranks. Fixed-width little-endian
// integers and floats, length-prefixed vectors and strings. The reader checks
// every length against the bytes left, so a truncated or corrupt message gives
// an error instead of a read past the end or a huge allocation.
#ifndef PAGEDSERVE_DISTRIBUTED_WIRE_H_
#define PAGEDSERVE_DISTRIBUTED_WIRE_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pagedserve::wire {

class Writer {
 public:
  template <typename T>
  void Put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const char* p = reinterpret_cast<const char*>(&v);
    buf_.append(p, sizeof(T));
  }
  template <typename T>
  void PutVector(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    Put<uint64_t>(v.size());
    buf_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  void PutString(std::string_view s) {
    Put<uint64_t>(s.size());
    buf_.append(s.data(), s.size());
  }
  std::string& buffer() { return buf_; }

 private:
  std::string buf_;
};

class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}

  template <typename T>
  absl::Status Get(T* v, const char* field) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (data_.size() - pos_ < sizeof(T)) return Truncated(field);
    std::memcpy(v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }
  template <typename T>
  absl::Status GetVector(std::vector<T>* v, const char* field) {
    uint64_t n = 0;
    if (auto s = Get(&n, field); !s.ok()) return s;
    if (n > (data_.size() - pos_) / sizeof(T)) return Truncated(field);
    v->resize(n);
    if (n > 0) std::memcpy(v->data(), data_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return absl::OkStatus();
  }
  absl::Status GetString(std::string* s, const char* field) {
    uint64_t n = 0;
    if (auto st = Get(&n, field); !st.ok()) return st;
    if (n > data_.size() - pos_) return Truncated(field);
    s->assign(data_.data() + pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }
  // Bound for element counts that are decoded one by one.
  absl::Status CheckCount(uint64_t n, size_t min_elem_bytes, const char* field) const {
    if (n > (data_.size() - pos_) / (min_elem_bytes ? min_elem_bytes : 1)) return Truncated(field);
    return absl::OkStatus();
  }
  bool done() const { return pos_ == data_.size(); }
  size_t pos() const { return pos_; }

 private:
  absl::Status Truncated(const char* field) const {
    return absl::DataLossError(absl::StrCat("wire message truncated or corrupt at byte ", pos_,
                                            " of ", data_.size(), " reading '", field, "'"));
  }
  std::string_view data_;
  size_t pos_ = 0;
};

}  // namespace pagedserve::wire

#endif  // PAGEDSERVE_DISTRIBUTED_WIRE_H_
