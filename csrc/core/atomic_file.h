// The one way torchspeed's C++ writes a file: a unique temporary beside it, fsynced, renamed.
// Torch-free and header-only (the torch-free profile core and the data area both use it); the
// Python side has the same helper, torchspeed/_atomic.py.
//
//   torchspeed::atomic_write_file(path, bytes, "torchspeed.profile.export_chrome_trace");
//
// A reader sees the old file or the new one, never half of one; a crash keeps the old one.
// The target must be absent or a regular file (a symlink to a regular file writes that file): a
// directory, FIFO, socket, device or a symlink to one is refused before anything is written, so
// an output path can never turn a device node or a pipe into a plain file. Every write error
// (ENOSPC or EFBIG on write, fsync or close) is thrown, the temporary removed and the target left
// as it was. The temporary's name is unique per call (host, pid, thread, random), so threads
// writing one path all succeed and the last rename wins.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

namespace torchspeed {

namespace atomic_file_detail {

inline std::string errno_text(int err) { return std::string(std::strerror(err)); }

inline const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

inline std::string host_token() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "host";
  std::string out;
  for (const char* c = buf; *c != '\0' && out.size() < 40; ++c) {
    const bool alnum =
        (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9');
    out += alnum ? *c : '_';
  }
  return out;
}

}  // namespace atomic_file_detail

/// The file a write of `path` replaces: `path`, or the regular file a symlink points at.
/// Throws std::runtime_error "<who>: '<path>' is a FIFO, not a regular file; ..." otherwise.
inline std::string atomic_write_target(const std::string& path, const std::string& who) {
  using atomic_file_detail::kind_of;
  if (path.empty() || path.back() == '/') {
    throw std::runtime_error(who + ": the path must name a file, got '" + path + "'");
  }
  struct stat lst {};
  if (::lstat(path.c_str(), &lst) != 0) {
    if (errno == ENOENT) return path;
    throw std::runtime_error(who + ": cannot inspect '" + path +
                             "': " + atomic_file_detail::errno_text(errno));
  }
  if (S_ISREG(lst.st_mode)) return path;
  std::string what;
  if (S_ISLNK(lst.st_mode)) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      throw std::runtime_error(who + ": '" + path +
                               "' is a dangling symlink; refusing to write through it");
    }
    if (S_ISREG(st.st_mode)) {
      char resolved[PATH_MAX];
      if (::realpath(path.c_str(), resolved) == nullptr) {
        throw std::runtime_error(who + ": cannot resolve the symlink '" + path +
                                 "': " + atomic_file_detail::errno_text(errno));
      }
      return std::string(resolved);
    }
    what = std::string("a symlink to ") + kind_of(st.st_mode);
  } else {
    what = kind_of(lst.st_mode);
  }
  throw std::runtime_error(who + ": '" + path + "' is " + what +
                           ", not a regular file; refusing to replace it");
}

/// A fresh temporary name beside `target`: .<name>.tmp-<host>-<pid>-<thread>-<random>.
inline std::string atomic_write_temp_path(const std::string& target) {
  const size_t slash = target.rfind('/');
  const std::string folder = slash == std::string::npos ? "" : target.substr(0, slash + 1);
  const std::string name = slash == std::string::npos ? target : target.substr(slash + 1);
  thread_local std::mt19937_64 rng{std::random_device{}() ^
                                   std::hash<std::thread::id>{}(std::this_thread::get_id())};
  char rand_hex[17];
  std::snprintf(rand_hex, sizeof(rand_hex), "%016llx", static_cast<unsigned long long>(rng()));
  return folder + "." + name + ".tmp-" + atomic_file_detail::host_token() + "-" +
         std::to_string(::getpid()) + "-" +
         std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id())) + "-" + rand_hex;
}

/// Writes `data` to `path` atomically (see the file comment); throws std::runtime_error
/// "<who>: ..." naming the path and the system error.
inline void atomic_write_file(const std::string& path, std::string_view data,
                              const std::string& who) {
  const std::string target = atomic_write_target(path, who);
  struct stat old {};
  const bool had_old = ::stat(target.c_str(), &old) == 0;
  const std::string tmp = atomic_write_temp_path(target);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) {
    throw std::runtime_error(who + ": cannot create '" + tmp +
                             "': " + atomic_file_detail::errno_text(errno));
  }
  auto fail = [&](const std::string& what, int err, bool close_fd) {
    if (close_fd) ::close(fd);
    ::unlink(tmp.c_str());
    throw std::runtime_error(who + ": " + what + " '" + path +
                             "': " + atomic_file_detail::errno_text(err) +
                             " (the previous file, if any, is unchanged)");
  };
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", errno, true);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) fail("cannot fsync", errno, true);
  if (::close(fd) != 0) fail("cannot close", errno, false);
  if (had_old) (void)::chmod(tmp.c_str(), old.st_mode & 07777);
  try {
    atomic_write_target(path, who);  // a FIFO made while we wrote: still refused
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) fail("cannot rename into", errno, false);
  // The rename is durable once the folder is: fsync it (not every filesystem supports it).
  const size_t slash = target.rfind('/');
  const std::string folder = slash == std::string::npos ? "." : target.substr(0, slash + 1);
  const int dfd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace torchspeed
