// pread-based read-only file; errors name the path and say what changed or the OS reason.
#include "data/mapped_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace torchspeed::data {
namespace {

int64_t mtime_of(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 +
         static_cast<int64_t>(st.st_mtim.tv_nsec);
}

}  // namespace

ReadOnlyFile::ReadOnlyFile(const std::string& path) : path_(path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) {
    throw std::runtime_error("torchspeed.data: cannot open '" + path +
                             "': " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw std::runtime_error("torchspeed.data: cannot stat '" + path + "': " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw std::runtime_error("torchspeed.data: '" + path + "' is not a regular file");
  }
  size_ = static_cast<uint64_t>(st.st_size);
  mtime_ns_ = mtime_of(st);
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

void ReadOnlyFile::check_unchanged() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    throw std::runtime_error("torchspeed.data: cannot stat '" + path_ +
                             "': " + std::strerror(errno));
  }
  const uint64_t now = static_cast<uint64_t>(st.st_size);
  if (now != size_) {
    throw std::runtime_error("torchspeed.data: '" + path_ + "' changed while in use (size " +
                             std::to_string(size_) + " -> " + std::to_string(now) +
                             " bytes): it was truncated or rewritten under the loader");
  }
  if (mtime_of(st) != mtime_ns_) {
    throw std::runtime_error("torchspeed.data: '" + path_ +
                             "' was modified while in use (same size, new modification time): "
                             "it was rewritten under the loader");
  }
}

void ReadOnlyFile::read(uint64_t offset, size_t n, uint8_t* out, bool check_unchanged) const {
  if (offset > size_ || n > size_ - offset) {
    throw std::runtime_error("torchspeed.data: '" + path_ + "': read of " + std::to_string(n) +
                             " bytes at offset " + std::to_string(offset) + " lies outside the " +
                             std::to_string(size_) + "-byte file");
  }
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd_, out + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("torchspeed.data: cannot read '" + path_ +
                               "': " + std::strerror(errno));
    }
    if (r == 0) {
      throw std::runtime_error("torchspeed.data: '" + path_ + "' is shorter than when it was " +
                               "opened (" + std::to_string(size_) + " bytes; read ended at byte " +
                               std::to_string(offset + done) +
                               "): it was truncated under the loader");
    }
    done += static_cast<size_t>(r);
  }
  if (check_unchanged) this->check_unchanged();
}

}  // namespace torchspeed::data
