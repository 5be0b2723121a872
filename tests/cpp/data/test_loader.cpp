// Catch2 tests of torchspeed::data::Loader: determinism across worker counts, resume, errors
// naming shard and key, skip counts, sharding, slot-reuse safety, shutdown.
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>

#include "catch_shim.h"
#include "data/sources.h"
#include "data_test_utils.h"
#include "torchspeed/data/loader.h"

namespace fs = std::filesystem;
namespace tsd = torchspeed::data;
using namespace torchspeed::data::testing;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/torchspeed_data_test_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void write_file(const fs::path& p, const std::string& data) {
  std::ofstream f(p, std::ios::binary);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

#if TORCHSPEED_WITH_JPEG
// Shards of `per_shard` samples: <key>.jpg (random size around 64x48) + <key>.cls.
std::vector<std::string> make_shards(const fs::path& dir, int shards, int per_shard,
                                     const std::string& corrupt_key = "") {
  std::vector<std::string> urls;
  for (int s = 0; s < shards; ++s) {
    TarWriter w;
    for (int i = 0; i < per_shard; ++i) {
      const int id = s * per_shard + i;
      char key[32];
      std::snprintf(key, sizeof(key), "s%02d/%06d", s, id);
      const int width = 56 + (id * 7) % 30, height = 40 + (id * 5) % 20;
      std::string jpg =
          encode_jpeg(textured_rgb(width, height, static_cast<uint32_t>(id)), width, height, 90);
      if (key == corrupt_key) jpg = jpg.substr(0, jpg.size() / 3);
      w.add(std::string(key) + ".jpg", jpg);
      w.add(std::string(key) + ".cls", std::to_string(id % 10));
    }
    const fs::path p = dir / ("shard-" + std::to_string(s) + ".tar");
    write_file(p, w.finish());
    urls.push_back(p.string());
  }
  return urls;
}

tsd::WebDatasetOptions wds_options(const std::vector<std::string>& urls) {
  tsd::WebDatasetOptions o;
  o.urls = urls;
  o.fields = {"jpg;png", "cls", "__key__"};
  o.image.height = 32;
  o.image.width = 32;
  o.image.flip_prob = 0.5;
  return o;
}

std::vector<tsd::Batch> run_epoch(tsd::Loader& loader, int max_batches = 1 << 30) {
  std::vector<tsd::Batch> out;
  loader.start_epoch();
  while (static_cast<int>(out.size()) < max_batches) {
    auto b = loader.next();
    if (!b) break;
    tsd::Batch copy = *b;
    for (auto& [k, t] : copy.tensors) t = t.clone();
    out.push_back(std::move(copy));
  }
  return out;
}

bool same_batches(const std::vector<tsd::Batch>& a, const std::vector<tsd::Batch>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].sample_indices != b[i].sample_indices) return false;
    for (const auto& [k, t] : a[i].tensors) {
      if (!torch::equal(t, b[i].tensors.at(k))) return false;
    }
    if (a[i].strings != b[i].strings) return false;
  }
  return true;
}

TEST_CASE("loader: bitwise identical batches for 1, 2 and 4 workers; epochs differ",
          "[data][loader]") {
  TempDir tmp;
  const auto urls = make_shards(tmp.path, 3, 17);
  tsd::LoaderOptions o;
  o.batch_size = 8;
  o.shuffle = true;
  o.seed = 123;
  std::vector<std::vector<tsd::Batch>> runs;
  for (int w : {1, 2, 4}) {
    o.num_workers = w;
    tsd::Loader loader(tsd::webdataset_source(wds_options(urls)), o);
    REQUIRE(loader.num_batches() == 7);  // 51 samples, partial last batch
    runs.push_back(run_epoch(loader));
    const auto epoch1 = run_epoch(loader);
    CHECK_FALSE(same_batches(runs.back(), epoch1));
    const auto st = loader.stats();
    CHECK(st.samples == 102);
    CHECK(st.decode_s > 0);
  }
  REQUIRE(runs[0].size() == 7);
  CHECK(runs[0].back().size() == 3);
  CHECK(same_batches(runs[0], runs[1]));
  CHECK(same_batches(runs[0], runs[2]));
  // Labels and keys agree with the sample indices.
  const auto& b0 = runs[0][0];
  for (int64_t r = 0; r < b0.size(); ++r) {
    const int64_t idx = b0.sample_indices[static_cast<size_t>(r)];
    CHECK(b0.tensors.at("cls")[r].item<int64_t>() == idx % 10);
    char key[32];
    std::snprintf(key, sizeof(key), "s%02d/%06d", static_cast<int>(idx / 17),
                  static_cast<int>(idx));
    CHECK(b0.strings.at("__key__")[static_cast<size_t>(r)] == key);
  }
  CHECK(b0.tensors.at("jpg;png").sizes() == torch::IntArrayRef({8, 3, 32, 32}));
  CHECK(b0.tensors.at("jpg;png").dtype() == torch::kUInt8);
}

TEST_CASE("loader: resume mid-epoch with a different worker count", "[data][loader]") {
  TempDir tmp;
  const auto urls = make_shards(tmp.path, 2, 20);
  tsd::LoaderOptions o;
  o.batch_size = 6;
  o.shuffle = true;
  o.seed = 7;
  o.num_workers = 2;
  tsd::Loader full(tsd::webdataset_source(wds_options(urls)), o);
  full.set_epoch(3);
  const auto all = run_epoch(full);

  tsd::Loader first(tsd::webdataset_source(wds_options(urls)), o);
  first.set_epoch(3);
  first.start_epoch();
  for (int i = 0; i < 3; ++i) REQUIRE(first.next().has_value());
  const auto state = first.state_dict();
  CHECK(state.at("epoch") == 3);
  CHECK(state.at("batches_consumed") == 3);

  o.num_workers = 3;
  tsd::Loader second(tsd::webdataset_source(wds_options(urls)), o);
  second.load_state_dict(state);
  const auto rest = run_epoch(second);
  REQUIRE(rest.size() == all.size() - 3);
  CHECK(same_batches(std::vector<tsd::Batch>(all.begin() + 3, all.end()), rest));
  CHECK(rest[0].index == 3);

  o.batch_size = 5;
  tsd::Loader other(tsd::webdataset_source(wds_options(urls)), o);
  CHECK(error_of([&] { other.load_state_dict(state); }).find("batch_size") != std::string::npos);
}

TEST_CASE("loader: corrupt JPEG raises naming shard and key, or is skipped and counted",
          "[data][loader]") {
  TempDir tmp;
  const auto urls = make_shards(tmp.path, 2, 10, "s01/000013");
  tsd::LoaderOptions o;
  o.batch_size = 4;
  o.num_workers = 2;
  {
    tsd::Loader loader(tsd::webdataset_source(wds_options(urls)), o);
    loader.start_epoch();
    int ok = 0;
    std::string err;
    while (true) {
      try {
        if (!loader.next()) break;
        ++ok;
      } catch (const std::exception& e) {
        err = e.what();
        break;
      }
    }
    CHECK(ok == 3);  // batches 0..2 hold samples 0..11; batch 3 holds sample 13
    CHECK(err.find("shard-1.tar") != std::string::npos);
    CHECK(err.find("s01/000013") != std::string::npos);
    CHECK(err.find("JPEG") != std::string::npos);
  }
  {
    o.on_error = "skip";
    tsd::Loader loader(tsd::webdataset_source(wds_options(urls)), o);
    const auto batches = run_epoch(loader);
    int64_t n = 0;
    for (const auto& b : batches) n += b.size();
    CHECK(n == 19);
    CHECK(batches[3].size() == 3);
    CHECK(batches[3].sample_indices == std::vector<int64_t>{12, 14, 15});
    CHECK(batches[3].strings.at("__key__")[1] == "s01/000014");
    CHECK(loader.stats().skipped == 1);
    CHECK(loader.stats().last_error.find("s01/000013") != std::string::npos);
  }
}

TEST_CASE("loader: truncated tar and missing files name the shard", "[data][loader]") {
  TempDir tmp;
  auto urls = make_shards(tmp.path, 1, 6);
  std::string data;
  {
    std::ifstream f(urls[0], std::ios::binary);
    data.assign(std::istreambuf_iterator<char>(f), {});
  }
  write_file(urls[0], data.substr(0, data.size() / 2));
  tsd::LoaderOptions o;
  o.batch_size = 2;
  tsd::Loader loader(tsd::webdataset_source(wds_options(urls)), o);
  std::string err;
  loader.start_epoch();
  try {
    while (loader.next()) {
    }
  } catch (const std::exception& e) {
    err = e.what();
  }
  CHECK(err.find("shard-0.tar") != std::string::npos);
  CHECK(err.find("truncated") != std::string::npos);

  const std::string missing = (tmp.path / "nope.tar").string();
  err = error_of([&] { tsd::webdataset_source(wds_options({missing})); });
  CHECK(err.find("nope.tar") != std::string::npos);
  CHECK(err.find("No such file") != std::string::npos);
}

TEST_CASE("loader: distributed ranks partition the epoch (pad and drop)", "[data][loader]") {
  TempDir tmp;
  const auto urls = make_shards(tmp.path, 1, 11);
  for (bool drop : {false, true}) {
    std::vector<int64_t> all;
    for (int r = 0; r < 3; ++r) {
      tsd::LoaderOptions o;
      o.batch_size = 2;
      o.shuffle = true;
      o.seed = 5;
      o.rank = r;
      o.world_size = 3;
      o.drop_uneven = drop;
      tsd::Loader loader(tsd::webdataset_source(wds_options(urls)), o);
      for (const auto& b : run_epoch(loader)) {
        all.insert(all.end(), b.sample_indices.begin(), b.sample_indices.end());
      }
    }
    CHECK(all.size() == (drop ? 9u : 12u));
    std::sort(all.begin(), all.end());
    CHECK(std::unique(all.begin(), all.end()) - all.begin() == (drop ? 9 : 11));
  }
}
#endif  // TORCHSPEED_WITH_JPEG

TEST_CASE("loader: tensor source gathers batches like index_select; kept batches stay intact",
          "[data][loader]") {
  const auto x = torch::arange(1000 * 6, torch::kFloat).reshape({1000, 2, 3});
  const auto y = torch::arange(1000, torch::kLong) * 3;
  tsd::LoaderOptions o;
  o.batch_size = 64;
  o.shuffle = true;
  o.seed = 11;
  o.num_workers = 3;
  tsd::Loader loader(tsd::tensor_source({{"x", x}, {"y", y}}), o);
  loader.start_epoch();
  std::vector<torch::Tensor> kept, kept_ref;
  std::vector<int64_t> seen;
  int count = 0;
  while (auto b = loader.next()) {
    const auto idx = torch::tensor(b->sample_indices, torch::kLong);
    CHECK(torch::equal(b->tensors.at("x"), x.index_select(0, idx)));
    CHECK(torch::equal(b->tensors.at("y"), y.index_select(0, idx)));
    seen.insert(seen.end(), b->sample_indices.begin(), b->sample_indices.end());
    if (count++ % 3 == 0) {  // keep some batches while the loader keeps going
      kept.push_back(b->tensors.at("x"));
      kept_ref.push_back(b->tensors.at("x").clone());
    }
  }
  CHECK(count == 16);
  std::sort(seen.begin(), seen.end());
  std::vector<int64_t> expected(1000);
  std::iota(expected.begin(), expected.end(), int64_t{0});
  CHECK(seen == expected);
  for (size_t i = 0; i < kept.size(); ++i) CHECK(torch::equal(kept[i], kept_ref[i]));
  const auto st = loader.stats();
  CHECK(st.batches == 16);
  CHECK(st.slots == 3 * 2 + 2);
}

TEST_CASE("loader: load_state_dict validates every field before changing anything",
          "[data][loader]") {
  const auto x = torch::arange(23, torch::kLong);
  tsd::LoaderOptions o;
  o.batch_size = 4;
  o.shuffle = true;
  o.seed = 3;
  o.num_workers = 2;
  tsd::Loader loader(tsd::tensor_source({{"x", x}}), o);
  loader.start_epoch();
  REQUIRE(loader.next().has_value());
  const auto good = loader.state_dict();
  CHECK(good.at("batches_consumed") == 1);
  const std::pair<const char*, int64_t> bad[] = {{"batches_consumed", -1},
                                                 {"batches_consumed", 7},
                                                 {"batches_consumed", INT64_MAX},
                                                 {"epoch", -1},
                                                 {"epoch", INT64_MAX},
                                                 {"skipped", -1},
                                                 {"shuffle", 0},
                                                 {"drop_last", 1},
                                                 {"seed", 4},
                                                 {"rank", 1},
                                                 {"dataset_size", 24},
                                                 {"world_size", 2}};
  for (const auto& [key, value] : bad) {
    auto state = good;
    state[key] = value;
    const std::string err = error_of([&] { loader.load_state_dict(state); });
    INFO(key << "=" << value << ": " << err);
    CHECK(err.find("torchspeed.data.Loader.load_state_dict") != std::string::npos);
    CHECK(err.find(key) != std::string::npos);
    CHECK(loader.state_dict() == good);  // nothing changed
  }
  auto extra = good;
  extra["epochs"] = 0;
  CHECK(error_of([&] { loader.load_state_dict(extra); }).find("unexpected key") !=
        std::string::npos);
  auto missing = good;
  missing.erase("skipped");
  CHECK(error_of([&] { loader.load_state_dict(missing); }).find("missing key 'skipped'") !=
        std::string::npos);
  // The epoch still runs where it was.
  int rest = 0;
  while (loader.next()) ++rest;
  CHECK(rest == 5);
}

TEST_CASE("loader: set_epoch during an epoch applies to the next one; empty order is empty",
          "[data][loader]") {
  const auto x = torch::arange(10, torch::kLong);
  tsd::LoaderOptions o;
  o.batch_size = 3;
  o.shuffle = true;
  o.seed = 1;
  tsd::Loader loader(tsd::tensor_source({{"x", x}}), o);
  tsd::Loader ref(tsd::tensor_source({{"x", x}}), o);
  const auto epoch0 = run_epoch(ref);
  ref.set_epoch(5);
  const auto epoch5 = run_epoch(ref);
  loader.start_epoch();
  std::vector<tsd::Batch> got;
  while (auto b = loader.next()) {
    loader.set_epoch(5);
    got.push_back(*b);
    REQUIRE(got.size() <= 4);
  }
  CHECK(same_batches(got, epoch0));
  CHECK(loader.epoch() == 5);
  CHECK(same_batches(run_epoch(loader), epoch5));
  CHECK(error_of([&] { loader.set_epoch(-1); }).find("epoch must be in") != std::string::npos);

  loader.set_indices({});
  CHECK(loader.num_batches() == 0);
  CHECK(run_epoch(loader).empty());
  loader.clear_indices();
  CHECK(loader.num_batches() == 4);
}

TEST_CASE("loader: npy source reads memory-mapped rows", "[data][loader]") {
  TempDir tmp;
  std::string header = "{'descr': '<i4', 'fortran_order': False, 'shape': (10, 3), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string npy("\x93NUMPY\x01\x00", 8);
  npy += static_cast<char>(header.size());
  npy += '\0';
  npy += header;
  for (int32_t v = 0; v < 30; ++v) npy.append(reinterpret_cast<const char*>(&v), 4);
  write_file(tmp.path / "a.npy", npy);
  tsd::LoaderOptions o;
  o.batch_size = 4;
  tsd::Loader loader(tsd::npy_source({{"a", (tmp.path / "a.npy").string()}}), o);
  loader.start_epoch();
  auto b = loader.next();
  REQUIRE(b);
  CHECK(torch::equal(b->tensors.at("a"), torch::arange(12, torch::kInt).reshape({4, 3})));
  CHECK(loader.num_batches() == 3);
}

TEST_CASE("loader: abandoning an epoch and destroying mid-epoch never hangs", "[data][loader]") {
  const auto x = torch::randn({5000, 16});
  tsd::LoaderOptions o;
  o.batch_size = 10;
  o.num_workers = 4;
  for (int rep = 0; rep < 20; ++rep) {
    tsd::Loader loader(tsd::tensor_source({{"x", x}}), o);
    loader.start_epoch();
    REQUIRE(loader.next());
    if (rep % 2) {
      loader.start_epoch();  // abandon: moves to the next epoch
      CHECK(loader.epoch() == 1);
      REQUIRE(loader.next());
    }
  }  // destructor joins the threads while batches are in flight
  tsd::Loader loader(tsd::tensor_source({{"x", x}}), o);
  loader.start_epoch();
  REQUIRE(loader.next());
  loader.shutdown();
  loader.shutdown();
  const auto st = loader.state_dict();
  CHECK(st.at("batches_consumed") == 1);
  auto b = loader.next();  // restarts the threads and resumes
  REQUIRE(b);
  CHECK(b->index == 1);
}

// A source whose samples take `delay_ms` each (for the timeout and stop tests).
class SlowSource final : public tsd::Source {
 public:
  explicit SlowSource(int delay_ms) : delay_ms_(delay_ms) {
    tsd::FieldSpec f;
    f.name = "x";
    f.dtype = torch::kLong;
    fields_.push_back(f);
  }
  int64_t size() const override { return 64; }
  const std::vector<tsd::FieldSpec>& fields() const override { return fields_; }
  void fill(int64_t index, int64_t row, const tsd::SlotView& slot,
            const tsd::FillContext&) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
    (*slot.tensors)[0].data_ptr<int64_t>()[row] = index;
  }

 private:
  int delay_ms_;
  std::vector<tsd::FieldSpec> fields_;
};

TEST_CASE("loader: timeout raises instead of hanging; destruction stays prompt", "[data][loader]") {
  tsd::LoaderOptions o;
  o.batch_size = 16;
  o.num_workers = 2;
  o.timeout_s = 0.2;
  tsd::Loader loader(std::make_shared<SlowSource>(100), o);  // a batch needs ~0.8 s
  loader.start_epoch();
  const auto t0 = std::chrono::steady_clock::now();
  const std::string err = error_of([&] { loader.next(); });
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(err.find("timed out") != std::string::npos);
  CHECK(waited < 1.0);
  const auto t1 = std::chrono::steady_clock::now();
  loader.shutdown();  // waits only for the chunks in progress (<= 8 samples per thread)
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count() < 1.5);
}

TEST_CASE("loader: next(should_stop) throws Cancelled promptly while a batch is not ready",
          "[data][loader]") {
  tsd::LoaderOptions o;
  o.batch_size = 16;
  o.num_workers = 1;
  tsd::Loader loader(std::make_shared<SlowSource>(100), o);  // a batch needs ~1.6 s
  int polls = 0;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(loader.next([&] { return ++polls >= 3; }), tsd::Cancelled);
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 1.0);
  CHECK(polls == 3);
  // Without a stop the same loader still delivers, from the first batch.
  auto b = loader.next();
  REQUIRE(b.has_value());
  CHECK(b->index == 0);
}

TEST_CASE("write_shard_index writes <shard>.idx atomically; the loader reads it",
          "[data][loader]") {
  TempDir dir;
  const auto urls = make_shards(dir.path, 1, 5);
  CHECK(tsd::write_shard_index(urls[0]) == 5);
  CHECK(fs::exists(urls[0] + ".idx"));
  for (const auto& e : fs::directory_iterator(dir.path)) {  // no temporary left
    CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
  }
  tsd::LoaderOptions o;
  o.batch_size = 5;
  tsd::Loader loader(tsd::webdataset_source(wds_options(urls)), o);
  auto b = loader.next();
  REQUIRE(b.has_value());
  CHECK(b->tensors.at("cls").size(0) == 5);
  // The scan polls its hook every 256 tar headers: 200 samples are 400 headers.
  TempDir big;
  const auto many = make_shards(big.path, 1, 200);
  CHECK_THROWS_AS(tsd::write_shard_index(many[0], [] { return true; }), tsd::Cancelled);
  CHECK(!fs::exists(many[0] + ".idx"));
  CHECK(error_of([&] {
          tsd::write_shard_index((dir.path / "missing.tar").string());
        }).find("missing.tar") != std::string::npos);
}

}  // namespace
