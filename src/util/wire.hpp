// Bounds-checked encoding of byte blobs exchanged with peers and the launcher. A Reader never
// reads past its span: every get reports failure instead, and the caller turns that into an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace ferry::util {

class Writer {
 public:
  template <typename T>
  void put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const std::byte*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void put_bytes(std::span<const std::byte> data) {
    put<std::uint32_t>(static_cast<std::uint32_t>(data.size()));
    bytes_.insert(bytes_.end(), data.begin(), data.end());
  }
  void put_string(std::string_view s) {
    put_bytes(std::as_bytes(std::span<const char>(s.data(), s.size())));
  }
  [[nodiscard]] const std::vector<std::byte>& bytes() const { return bytes_; }
  std::vector<std::byte> take() { return std::move(bytes_); }

 private:
  std::vector<std::byte> bytes_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> data) : data_(data) {}

  template <typename T>
  [[nodiscard]] bool get(T* value) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (data_.size() - offset_ < sizeof(T)) return fail();
    std::memcpy(value, data_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return true;
  }
  // A length-prefixed span, at most `limit` bytes long.
  [[nodiscard]] bool get_bytes(std::span<const std::byte>* out, std::size_t limit = SIZE_MAX) {
    std::uint32_t length = 0;
    if (!get(&length)) return false;
    if (length > limit || data_.size() - offset_ < length) return fail();
    *out = data_.subspan(offset_, length);
    offset_ += length;
    return true;
  }
  [[nodiscard]] bool get_string(std::string* out, std::size_t limit = SIZE_MAX) {
    std::span<const std::byte> bytes;
    if (!get_bytes(&bytes, limit)) return false;
    out->assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    return true;
  }
  [[nodiscard]] std::size_t remaining() const { return data_.size() - offset_; }
  [[nodiscard]] bool failed() const { return failed_; }

 private:
  bool fail() {
    failed_ = true;
    return false;
  }
  std::span<const std::byte> data_;
  std::size_t offset_ = 0;
  bool failed_ = false;
};

}  // namespace ferry::util
