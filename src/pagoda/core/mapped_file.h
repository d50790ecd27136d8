// A read-only memory-mapped file. Model files are mapped, not read: tensors are views into the
// mapping and pages load on first touch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace pagoda {

class MappedFile {
 public:
  // Throws Error(kNotFound) if the file cannot be opened, kInternal if it cannot be mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace pagoda
