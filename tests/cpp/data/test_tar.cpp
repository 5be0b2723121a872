// Catch2 tests of the torch-free tar reader, WebDataset grouping and the shard index format.
#include <string>

#include "catch_shim.h"
#include "data_test_utils.h"
#include "tar_reader.h"

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
    for (size_t i = 0; i < idx.samples.size(); ++i) {
      CHECK(back.samples[i].key == idx.samples[i].key);
      REQUIRE(back.samples[i].fields.size() == idx.samples[i].fields.size());
      for (size_t j = 0; j < idx.samples[i].fields.size(); ++j) {
        CHECK(back.samples[i].fields[j].ext == idx.samples[i].fields[j].ext);
        CHECK(back.samples[i].fields[j].offset == idx.samples[i].fields[j].offset);
        CHECK(back.samples[i].fields[j].size == idx.samples[i].fields[j].size);
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
