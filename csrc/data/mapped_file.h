// Read-only access to a data file (tar shards, .npy arrays) by pread, never mmap: a file that is
// truncated or rewritten while the loader uses it gives an error naming it instead of a SIGBUS.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "torchspeed/export.h"

namespace torchspeed::data {

class TORCHSPEED_API ReadOnlyFile {
 public:
  // Opens a regular file (FIFOs, directories and devices are refused rather than blocking) and
  // records its size and modification time; throws std::runtime_error naming the path.
  explicit ReadOnlyFile(const std::string& path);
  ~ReadOnlyFile();
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  // Size and modification time (ns since the epoch) when the file was opened.
  uint64_t size() const { return size_; }
  int64_t mtime_ns() const { return mtime_ns_; }
  const std::string& path() const { return path_; }

  // Reads exactly `n` bytes at `offset` into `out` (thread-safe). Throws std::runtime_error naming
  // the file if the range lies outside the size at open, if the file is now shorter (truncated
  // under the loader) or, with `check_unchanged`, if its size or modification time changed since
  // it was opened (rewritten in place: the bytes could be a mix of old and new content).
  void read(uint64_t offset, size_t n, uint8_t* out, bool check_unchanged = true) const;
  // Throws std::runtime_error naming the file if its size or modification time changed.
  void check_unchanged() const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  int64_t mtime_ns_ = 0;
};

}  // namespace torchspeed::data
