// Catch2 tests of the torch-free tar reader, WebDataset grouping and the shard index format.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "catch_shim.h"
#include "data/mapped_file.h"
#include "data/tar_reader.h"
#include "data_test_utils.h"

using namespace torchspeed::data;
using torchspeed::data::testing::bytes;
using torchspeed::data::testing::TarWriter;

namespace {
bool throws_with(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) {
      if (msg.find(p) == std::string::npos) {
        UNSCOPED_INFO("message '" << msg << "' lacks '" << p << "'");
        return false;
      }
    }
    return true;
  }
  return false;
}
}  // namespace

TEST_CASE("tar members: names, offsets, sizes, long names, directories", "[data][tar]") {
  TarWriter w;
  const std::string long_dir(120, 'd');
  w.add_dir("dir/");
  w.add("a.txt", "hello");
  w.add("b.bin", std::string(1000, 'x'));
  w.add(long_dir + "/c.txt", "long");
  w.add("empty.txt", "");
  const std::string tar = w.finish();
  const auto m = list_tar_members(bytes(tar), tar.size(), "t.tar");
  REQUIRE(m.size() == 4);
  CHECK(m[0].name == "a.txt");
  CHECK(m[0].offset == 1024);  // dir header + a.txt header
  CHECK(m[0].size == 5);
  CHECK(tar.substr(m[0].offset, m[0].size) == "hello");
  CHECK(m[1].name == "b.bin");
  CHECK(m[1].size == 1000);
  CHECK(m[2].name == long_dir + "/c.txt");
  CHECK(tar.substr(m[2].offset, m[2].size) == "long");
  CHECK(m[3].name == "empty.txt");
  CHECK(m[3].size == 0);
}

TEST_CASE("tar errors name the shard and the member", "[data][tar]") {
  TarWriter w;
  w.add("s1.jpg", std::string(3000, 'j'));
  const std::string tar = w.finish();
  const std::string truncated = tar.substr(0, 512 + 1000);
  CHECK(throws_with([&] { list_tar_members(bytes(truncated), truncated.size(), "shard-7.tar"); },
                    {"shard-7.tar", "s1.jpg", "truncated"}));
  std::string bad = tar;
  bad[10] = 'Z';  // breaks the header checksum
  CHECK(throws_with([&] { list_tar_members(bytes(bad), bad.size(), "bad.tar"); },
                    {"bad.tar", "checksum"}));
  const std::string half_header = tar.substr(0, 300);
  CHECK(throws_with([&] { list_tar_members(bytes(half_header), half_header.size(), "h.tar"); },
                    {"h.tar", "truncated header"}));
  CHECK(list_tar_members(nullptr, 0, "empty.tar").empty());
}

TEST_CASE("WebDataset naming splits at the first dot of the basename", "[data][tar]") {
  std::string k, e;
  REQUIRE(split_webdataset_name("dir.v1/sub/x.seg.PNG", &k, &e));
  CHECK(k == "dir.v1/sub/x");
  CHECK(e == "seg.png");
  REQUIRE(split_webdataset_name("000001.jpg", &k, &e));
  CHECK(k == "000001");
  CHECK(e == "jpg");
  CHECK_FALSE(split_webdataset_name("README", &k, &e));
  CHECK_FALSE(split_webdataset_name("dir/.hidden", &k, &e));
  CHECK_FALSE(split_webdataset_name("dir/x.", &k, &e));
}

TEST_CASE("shard index groups consecutive members by key", "[data][tar][index]") {
  TarWriter w;
  w.add("a/0001.jpg", "J1");
  w.add("a/0001.cls", "3");
  w.add("a/0002.cls", "4");
  w.add("a/0002.JPG", "J2");
  w.add("a/0002.meta.json", "{}");
  w.add("notes", "ignored: no extension");
  w.add("a/0003.txt", "t");
  const std::string tar = w.finish();
  const ShardIndex idx = ShardIndex::build(bytes(tar), tar.size(), "s.tar");
  REQUIRE(idx.samples.size() == 3);
  CHECK(idx.samples[0].key == "a/0001");
  REQUIRE(idx.samples[0].fields.size() == 2);
  CHECK(idx.samples[1].key == "a/0002");
  REQUIRE(idx.samples[1].fields.size() == 3);
  CHECK(idx.samples[1].fields[1].ext == "jpg");
  CHECK(idx.samples[1].fields[2].ext == "meta.json");
  const SampleField* f = idx.samples[1].find("jpg");
  REQUIRE(f != nullptr);
  CHECK(tar.substr(f->offset, f->size) == "J2");
  CHECK(idx.samples[2].key == "a/0003");

  SECTION("serialize round trip") {
    const std::string s = idx.serialize();
    const ShardIndex back = ShardIndex::deserialize(bytes(s), s.size(), "s.tar.idx");
    REQUIRE(back.samples.size() == idx.samples.size());
    CHECK(back.shard_size == tar.size());
    CHECK(back.shard_mtime_ns == idx.shard_mtime_ns);
    for (size_t i = 0; i < idx.samples.size(); ++i) {
      CHECK(back.samples[i].key == idx.samples[i].key);
      REQUIRE(back.samples[i].fields.size() == idx.samples[i].fields.size());
      for (size_t j = 0; j < idx.samples[i].fields.size(); ++j) {
        CHECK(back.samples[i].fields[j].ext == idx.samples[i].fields[j].ext);
        CHECK(back.samples[i].fields[j].offset == idx.samples[i].fields[j].offset);
        CHECK(back.samples[i].fields[j].size == idx.samples[i].fields[j].size);
        CHECK(back.samples[i].fields[j].header_hash == idx.samples[i].fields[j].header_hash);
      }
    }
    // Every truncation is rejected with a message naming the index.
    for (size_t n = 0; n < s.size(); ++n) {
      CHECK(throws_with([&] { ShardIndex::deserialize(bytes(s), n, "s.tar.idx"); }, {"s.tar.idx"}));
    }
  }
}

TEST_CASE("duplicate extension in one sample is an error naming shard and key", "[data][tar]") {
  TarWriter w;
  w.add("k1.jpg", "a");
  w.add("k1.jpg", "b");
  const std::string tar = w.finish();
  CHECK(throws_with([&] { ShardIndex::build(bytes(tar), tar.size(), "dup.tar"); },
                    {"dup.tar", "'k1'", "duplicate"}));
}

TEST_CASE("a damaged tar keeps the samples before the damage and marks the broken one",
          "[data][tar][index]") {
  TarWriter w;
  w.add("k0.jpg", std::string(600, 'a'));
  w.add("k0.cls", "1");
  w.add("k1.cls", "2");
  w.add("k1.jpg", std::string(3000, 'b'));
  const std::string tar = w.finish();
  const std::string cut = tar.substr(0, tar.size() - 1024 - 2048);  // inside k1.jpg's data
  const ShardIndex idx = ShardIndex::build(bytes(cut), cut.size(), "cut.tar");
  REQUIRE(idx.samples.size() == 2);
  CHECK(idx.samples[0].key == "k0");
  CHECK(idx.samples[0].error.empty());
  CHECK(idx.samples[1].key == "k1");
  CHECK(idx.samples[1].error.find("cut.tar") != std::string::npos);
  CHECK(idx.samples[1].error.find("k1.jpg") != std::string::npos);
  CHECK(idx.samples[1].error.find("truncated") != std::string::npos);
  const std::string s = idx.serialize();
  CHECK(ShardIndex::deserialize(bytes(s), s.size(), "x").samples[1].error == idx.samples[1].error);

  std::string garbage = tar;
  garbage[512 + 1024 + 5] = 'Q';  // k0.cls header (after k0.jpg's header and 2 data blocks)
  const ShardIndex g = ShardIndex::build(bytes(garbage), garbage.size(), "g.tar");
  REQUIRE(g.samples.size() == 1);
  CHECK(g.samples[0].key == "k0");
  CHECK(g.samples[0].error.find("checksum") != std::string::npos);
}

namespace {
ReadAt memory_reader(const std::string& s, size_t* reads = nullptr) {
  return [&s, reads](uint64_t offset, size_t n, uint8_t* out) {
    REQUIRE(offset <= s.size());
    REQUIRE(n <= s.size() - offset);
    std::memcpy(out, s.data() + offset, n);
    if (reads != nullptr) ++*reads;
  };
}
}  // namespace

TEST_CASE("indexing through a reader matches indexing the bytes in memory", "[data][tar][index]") {
  TarWriter w;
  const std::string long_dir(150, 'L');
  for (int i = 0; i < 40; ++i) {
    const std::string key = (i % 7 == 0 ? long_dir + "/" : "") + "s" + std::to_string(i);
    w.add(key + ".cls", std::to_string(i));
    w.add(key + ".bin", std::string(static_cast<size_t>(i) * 997, 'x'));  // some > one window
  }
  const std::string tar = w.finish();
  const ShardIndex mem = ShardIndex::build(bytes(tar), tar.size(), "m.tar");
  size_t reads = 0;
  const ShardIndex file = ShardIndex::build(tar.size(), memory_reader(tar, &reads), "m.tar");
  REQUIRE(mem.samples.size() == 40);
  REQUIRE(file.samples.size() == mem.samples.size());
  for (size_t i = 0; i < mem.samples.size(); ++i) {
    CHECK(file.samples[i].key == mem.samples[i].key);
    REQUIRE(file.samples[i].fields.size() == mem.samples[i].fields.size());
    for (size_t j = 0; j < mem.samples[i].fields.size(); ++j) {
      const SampleField &a = mem.samples[i].fields[j], &b = file.samples[i].fields[j];
      CHECK(a.ext == b.ext);
      CHECK(a.offset == b.offset);
      CHECK(a.size == b.size);
      CHECK(a.header_hash == b.header_hash);
      // The hash is of the member's own header block, right before its data.
      CHECK(a.header_hash == tar_header_hash(bytes(tar) + a.offset - 512));
    }
  }
  CHECK(reads < 80);  // small members share a window; data is skipped, not read

  SECTION("headers differing in one byte hash differently") {
    std::string h = tar.substr(0, 512);
    const uint64_t before = tar_header_hash(bytes(h));
    for (size_t i = 0; i < 512; i += 61) {
      std::string g = h;
      g[i] = static_cast<char>(g[i] ^ 1);
      CHECK(tar_header_hash(bytes(g)) != before);
    }
  }
  SECTION("a reader that fails (file shrank) marks the sample, like a truncated tar") {
    const ReadAt failing = [&tar](uint64_t offset, size_t n, uint8_t* out) {
      if (offset + n > tar.size() / 2) throw std::runtime_error("'m.tar' is shorter than ...");
      std::memcpy(out, tar.data() + offset, n);
    };
    const ShardIndex cut = ShardIndex::build(tar.size(), failing, "m.tar");
    REQUIRE(!cut.samples.empty());
    CHECK(cut.samples.size() < 40);
    CHECK(cut.samples.back().error.find("shorter") != std::string::npos);
  }
  SECTION("should_stop cancels a long scan") {
    int calls = 0;
    const std::function<bool()> stop = [&calls] { return ++calls >= 0; };
    TarWriter big;
    for (int i = 0; i < 2000; ++i) big.add("k" + std::to_string(i) + ".cls", "1");
    const std::string b = big.finish();
    CHECK(throws_with([&] { ShardIndex::build(b.size(), memory_reader(b), "big.tar", stop); },
                      {"big.tar", "cancelled"}));
    try {
      ShardIndex::build(b.size(), memory_reader(b), "big.tar", stop);
      FAIL("not cancelled");
    } catch (const Cancelled&) {
    }
    CHECK(calls >= 1);
    const std::function<bool()> never = [] { return false; };
    CHECK(ShardIndex::build(b.size(), memory_reader(b), "big.tar", never).samples.size() == 2000);
  }
}

TEST_CASE("index format: version, mtime and header hashes are checked", "[data][tar][index]") {
  TarWriter w;
  w.add("a.cls", "1");
  w.add("b.cls", "2");
  const std::string tar = w.finish();
  ShardIndex idx = ShardIndex::build(bytes(tar), tar.size(), "v.tar");
  idx.shard_mtime_ns = 1234567890123456789;
  const std::string s = idx.serialize();
  REQUIRE(s.compare(0, 8, "TSIDX003") == 0);
  CHECK(ShardIndex::deserialize(bytes(s), s.size(), "v.idx").shard_mtime_ns == idx.shard_mtime_ns);
  std::string old = s;
  old[7] = '2';
  CHECK(throws_with([&] { ShardIndex::deserialize(bytes(old), old.size(), "v.idx"); },
                    {"v.idx", "version '002' is not supported"}));
  std::string other = s;
  other[0] = 'X';
  CHECK(throws_with([&] { ShardIndex::deserialize(bytes(other), other.size(), "v.idx"); },
                    {"v.idx", "bad magic"}));
  // A field whose offset leaves no room for its tar header is refused (reads check the header).
  ShardIndex bad = idx;
  bad.samples[0].fields[0].offset = 100;
  const std::string b = bad.serialize();
  CHECK(throws_with([&] { ShardIndex::deserialize(bytes(b), b.size(), "v.idx"); },
                    {"v.idx", "outside the shard"}));
}

TEST_CASE("ReadOnlyFile reads exactly and reports truncation and rewrites", "[data][file]") {
  char tmpl[] = "/tmp/torchspeed-test-file-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  REQUIRE(fd >= 0);
  ::close(fd);
  const std::string path = tmpl;
  {
    std::ofstream out(path, std::ios::binary);
    out << std::string(10000, 'a');
  }
  {
    ReadOnlyFile f(path);
    CHECK(f.size() == 10000);
    std::string buf(100, '\0');
    f.read(9900, 100, reinterpret_cast<uint8_t*>(&buf[0]));
    CHECK(buf == std::string(100, 'a'));
    CHECK(throws_with([&] { f.read(9950, 100, reinterpret_cast<uint8_t*>(&buf[0])); },
                      {path, "outside"}));
    REQUIRE(::truncate(path.c_str(), 5000) == 0);
    CHECK(throws_with([&] { f.read(9900, 100, reinterpret_cast<uint8_t*>(&buf[0]), false); },
                      {path, "truncated"}));
    CHECK(throws_with([&] { f.read(0, 100, reinterpret_cast<uint8_t*>(&buf[0])); },
                      {path, "size 10000 -> 5000"}));
  }
  CHECK(throws_with([] { ReadOnlyFile("/nonexistent/x.tar"); }, {"/nonexistent/x.tar", "open"}));
  CHECK(throws_with([] { ReadOnlyFile("/tmp"); }, {"/tmp", "not a regular file"}));
  std::remove(path.c_str());
}
