// Torch-free tests of the one atomic file write (csrc/core/atomic_file.h): a new file, a replaced
// one, refusals (directory, FIFO, symlink to a FIFO, dangling symlink) that leave the target as
// it was, a write through a symlink to a regular file, threads writing one path, and a write
// error (the file size limit, EFBIG) thrown with the old file intact and no temporary left.
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "catch_shim.h"
#include "core/atomic_file.h"

namespace {

std::string make_temp_dir() {
  char tmpl[] = "/tmp/ts_atomic_XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  return tmpl;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  REQUIRE(d != nullptr);
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  ::closedir(d);
  return out;
}

bool refused(const std::string& path, const std::string& what) {
  try {
    torchspeed::atomic_write_file(path, "new", "test");
  } catch (const std::runtime_error& e) {
    return std::string(e.what()).find(what) != std::string::npos;
  }
  return false;
}

}  // namespace

TEST_CASE("atomic_write_file writes a new file and replaces a regular one") {
  const std::string dir = make_temp_dir();
  const std::string p = dir + "/out.json";
  torchspeed::atomic_write_file(p, "first", "test");
  CHECK(slurp(p) == "first");
  ::chmod(p.c_str(), 0640);
  torchspeed::atomic_write_file(p, std::string(100000, 'x'), "test");
  CHECK(slurp(p) == std::string(100000, 'x'));
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0640);  // the replaced file's mode is kept
  CHECK(entries(dir).size() == 1);     // no temporary left
}

TEST_CASE("atomic_write_file refuses a target that is not a regular file") {
  const std::string dir = make_temp_dir();
  const std::string sub = dir + "/sub", fifo = dir + "/fifo";
  REQUIRE(::mkdir(sub.c_str(), 0755) == 0);
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  REQUIRE(::symlink(fifo.c_str(), (dir + "/to_fifo").c_str()) == 0);
  REQUIRE(::symlink((dir + "/missing").c_str(), (dir + "/dangling").c_str()) == 0);
  CHECK(refused(sub, "is a directory, not a regular file; refusing to replace it"));
  CHECK(refused(fifo, "is a FIFO, not a regular file"));
  CHECK(refused(dir + "/to_fifo", "is a symlink to a FIFO"));
  CHECK(refused(dir + "/dangling", "dangling symlink"));
  CHECK(refused(sub + "/", "must name a file"));
  struct stat st {};
  REQUIRE(::lstat(fifo.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));  // untouched
  REQUIRE(::lstat((dir + "/to_fifo").c_str(), &st) == 0);
  CHECK(S_ISLNK(st.st_mode));
  CHECK(entries(dir).size() == 4);  // no temporary, nothing created
}

TEST_CASE("atomic_write_file writes through a symlink to a regular file") {
  const std::string dir = make_temp_dir();
  torchspeed::atomic_write_file(dir + "/real", "old", "test");
  REQUIRE(::symlink((dir + "/real").c_str(), (dir + "/link").c_str()) == 0);
  torchspeed::atomic_write_file(dir + "/link", "new", "test");
  struct stat st {};
  REQUIRE(::lstat((dir + "/link").c_str(), &st) == 0);
  CHECK(S_ISLNK(st.st_mode));
  CHECK(slurp(dir + "/real") == "new");
}

TEST_CASE("atomic_write_file from many threads to one path: every write succeeds") {
  const std::string dir = make_temp_dir();
  const std::string p = dir + "/same";
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        try {
          torchspeed::atomic_write_file(p, std::string(1000, static_cast<char>('a' + t)), "test");
        } catch (...) {
          ++errors;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(errors == 0);
  const std::string got = slurp(p);
  CHECK(got.size() == 1000);
  CHECK(got == std::string(1000, got[0]));  // one writer's whole content
  CHECK(entries(dir).size() == 1);
}

TEST_CASE("atomic_write_file reports a write error and keeps the old file") {
  const std::string dir = make_temp_dir();
  const std::string p = dir + "/big";
  torchspeed::atomic_write_file(p, "old", "test");
  // The file size limit makes write() fail with EFBIG (SIGXFSZ ignored): a real write error,
  // without a full disk or a device.
  struct rlimit saved {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
  const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved;
  small.rlim_cur = 4096;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  bool threw = false;
  std::string msg;
  try {
    torchspeed::atomic_write_file(p, std::string(1 << 20, 'z'), "test");
  } catch (const std::runtime_error& e) {
    threw = true;
    msg = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::signal(SIGXFSZ, old_handler);
  CHECK(threw);
  CHECK(msg.find("cannot write") != std::string::npos);
  CHECK(slurp(p) == "old");
  CHECK(entries(dir).size() == 1);
}
