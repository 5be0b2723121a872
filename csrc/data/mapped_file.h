// Read-only memory mapping of a file (tar shards, .npy arrays) so random access reads only what it
// touches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "torchspeed/export.h"

namespace torchspeed {
namespace data {

class TORCHSPEED_API MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws std::runtime_error naming the path
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace data
}  // namespace torchspeed
