// Loader sources: WebDataset tar shards (pread + index), .npy files (pread) and in-memory tensors
// (batched index_select). Files are read, never mapped, so one that shrinks under the loader gives
// an error naming it, not a SIGBUS.
#include "data/sources.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "core/atomic_file.h"
#include "core/clock.h"
#include "core/utf8.h"
#include "data/mapped_file.h"
#include "data/npy.h"
#include "data/tar_reader.h"

namespace torchspeed::data {
namespace {

at::ScalarType npy_to_torch(NpyType t) {
  switch (t) {
    case NpyType::kBool:
      return at::kBool;
    case NpyType::kUInt8:
      return at::kByte;
    case NpyType::kInt8:
      return at::kChar;
    case NpyType::kInt16:
      return at::kShort;
    case NpyType::kInt32:
      return at::kInt;
    case NpyType::kInt64:
      return at::kLong;
    case NpyType::kUInt16:
      return at::kUInt16;
    case NpyType::kFloat16:
      return at::kHalf;
    case NpyType::kFloat32:
      return at::kFloat;
    case NpyType::kFloat64:
      return at::kDouble;
  }
  return at::kByte;
}

std::string last_ext_part(const std::string& ext) {
  const size_t dot = ext.rfind('.');
  return dot == std::string::npos ? ext : ext.substr(dot + 1);
}

enum class Kind { kImage, kLabel, kString, kNpy };

bool kind_of(const std::string& ext, Kind* kind) {
  const std::string e = last_ext_part(ext);
  if (e == "jpg" || e == "jpeg" || e == "png")
    *kind = Kind::kImage;
  else if (e == "cls" || e == "cls2" || e == "id" || e == "index")
    *kind = Kind::kLabel;
  else if (e == "txt" || e == "json")
    *kind = Kind::kString;
  else if (e == "npy")
    *kind = Kind::kNpy;
  else
    return false;
  return true;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) {
    if (!cur.empty()) out.push_back(cur);
  }
  return out;
}

size_t row_bytes(const FieldSpec& f) {
  size_t n = c10::elementSize(f.dtype);
  for (auto d : f.shape) n *= static_cast<size_t>(d);
  return n;
}

uint8_t* row_ptr(const at::Tensor& t, int64_t row, size_t bytes) {
  return static_cast<uint8_t*>(t.data_ptr()) + static_cast<size_t>(row) * bytes;
}

constexpr size_t kTarHeader = 512;

// Reads a tar member together with its header into *buf (one pread) and checks that the header is
// the one the index recorded, so a shard rewritten after indexing cannot hand out another member's
// bytes. Returns the member's data (buf->data() + 512).
const uint8_t* read_member(const ReadOnlyFile& file, const SampleField& f,
                           std::vector<uint8_t>* buf) {
  // The index guarantees offset >= 512 and offset + size <= shard size (== file size).
  buf->resize(kTarHeader + static_cast<size_t>(f.size));
  file.read(f.offset - kTarHeader, buf->size(), buf->data());
  if (tar_header_hash(buf->data()) != f.header_hash) {
    throw std::runtime_error("the tar header at offset " + std::to_string(f.offset - kTarHeader) +
                             " of '" + file.path() +
                             "' is not the one indexed for this member: the shard was rewritten "
                             "after it was indexed (delete '" +
                             file.path() + ".idx' or write it again)");
  }
  return buf->data() + kTarHeader;
}

// ---------------------------------------------------------------------------------------------
class WebDatasetSource final : public Source {
 public:
  explicit WebDatasetSource(const WebDatasetOptions& opt) : opt_(opt) {
    validate_transform_options(opt_.image);
    if (opt_.image.normalize) opt_.image.to_float = true;
    TORCH_CHECK(!opt_.urls.empty(), "torchspeed.data.WebDataset: urls must not be empty");
    for (size_t s = 0; s < opt_.urls.size(); ++s) {
      if (opt_.should_stop && opt_.should_stop()) {
        throw Cancelled("torchspeed.data.WebDataset: cancelled while indexing shard " +
                        std::to_string(s) + " of " + std::to_string(opt_.urls.size()));
      }
      Shard sh;
      sh.file = std::make_unique<ReadOnlyFile>(opt_.urls[s]);
      sh.index = load_or_build_index(*sh.file, opt_.should_stop);
      for (size_t i = 0; i < sh.index.samples.size(); ++i) {
        table_.emplace_back(static_cast<uint32_t>(s), static_cast<uint32_t>(i));
      }
      shards_.push_back(std::move(sh));
    }
    TORCH_CHECK(!table_.empty(), "torchspeed.data.WebDataset: no samples in ", opt_.urls.size(),
                " shard(s) starting with '", opt_.urls[0], "'");
    discover_fields();
  }

  int64_t size() const override { return static_cast<int64_t>(table_.size()); }
  const std::vector<FieldSpec>& fields() const override { return specs_; }

  std::string describe(int64_t index) const override {
    const auto& [s, i] = table_[static_cast<size_t>(index)];
    return "shard '" + opt_.urls[s] + "' sample '" + shards_[s].index.samples[i].key + "'";
  }

  void fill(int64_t index, int64_t row, const SlotView& slot, const FillContext& ctx) override {
    const auto& [s, i] = table_[static_cast<size_t>(index)];
    const Shard& sh = shards_[s];
    const SampleEntry& e = sh.index.samples[i];
    try {
      if (!e.error.empty()) throw std::runtime_error(e.error);
      for (size_t f = 0; f < specs_.size(); ++f) {
        if (f == key_field_) {
          (*slot.strings)[f][static_cast<size_t>(row)] = e.key;
          continue;
        }
        const SampleField* sf = nullptr;
        for (const auto& alt : alternatives_[f]) {
          if ((sf = e.find(alt)) != nullptr) break;
        }
        if (sf == nullptr) throw std::runtime_error("missing field '" + specs_[f].name + "'");
        auto t0 = Clock::now();
        // "read": pread the member (and its header, to check it against the index).
        thread_local std::vector<uint8_t> buf;
        const uint8_t* member = read_member(*sh.file, *sf, &buf);
        if (ctx.times) ctx.times->read += seconds_since(t0);
        fill_field(f, sf->ext, member, static_cast<size_t>(sf->size), index, row, slot, ctx);
      }
    } catch (const std::exception& ex) {
      throw std::runtime_error(describe(index) + ": " + ex.what());
    }
  }

 private:
  struct Shard {
    std::unique_ptr<ReadOnlyFile> file;
    ShardIndex index;
  };

  // Why the index `index` (read from the shard's .idx) does not describe `file`, or "" if it does:
  // size and modification time must match, and a few members' headers are spot-checked so most
  // rewrites that kept both are caught here (the rest fail on read, never silently).
  static std::string index_mismatch(const ShardIndex& index, const ReadOnlyFile& file) {
    if (index.shard_size != file.size()) {
      return "it was written for a " + std::to_string(index.shard_size) +
             "-byte shard, the shard " + "has " + std::to_string(file.size()) + " bytes";
    }
    if (index.shard_mtime_ns != file.mtime_ns()) {
      return "the shard was modified after the index was written";
    }
    std::vector<const SampleField*> fields;
    for (const auto& e : index.samples) {
      for (const auto& f : e.fields) fields.push_back(&f);
    }
    constexpr size_t kSpotChecks = 8;
    uint8_t header[kTarHeader];
    for (size_t k = 0; k < std::min(kSpotChecks, fields.size()); ++k) {
      // Evenly spread, always including the first and the last member.
      const size_t i =
          kSpotChecks >= fields.size() ? k : k * (fields.size() - 1) / (kSpotChecks - 1);
      const SampleField& f = *fields[i];
      file.read(f.offset - kTarHeader, kTarHeader, header, false);
      if (tar_header_hash(header) != f.header_hash) {
        return "the tar header at offset " + std::to_string(f.offset - kTarHeader) +
               " is not the one the index recorded";
      }
    }
    return "";
  }

  static ShardIndex load_or_build_index(const ReadOnlyFile& file,
                                        const std::function<bool()>& should_stop) {
    const std::string idx_path = file.path() + ".idx";
    struct stat st {};
    if (::stat(idx_path.c_str(), &st) == 0) {
      std::string why;
      try {
        ReadOnlyFile idx(idx_path);
        // An index never needs more bytes than its shard has (plus the fixed part and an error
        // text): anything larger is not one, and is not read into memory.
        if (idx.size() > file.size() + 65536) {
          why = "it is larger than its shard";
        } else {
          std::vector<uint8_t> bytes(static_cast<size_t>(idx.size()));
          idx.read(0, bytes.size(), bytes.data());
          ShardIndex index = ShardIndex::deserialize(bytes.data(), bytes.size(), idx_path);
          why = index_mismatch(index, file);
          if (why.empty()) return index;
        }
      } catch (const std::exception& e) {
        why = e.what();
      }
      // A stale or damaged index is not an error (the shard is the truth), but it costs a scan on
      // every load, so say so.
      TORCH_WARN("torchspeed.data.WebDataset: ignoring the index '", idx_path, "' (", why,
                 "); indexing '", file.path(),
                 "' in memory instead. Write the index again (torchspeed.data.write_shards) or ",
                 "delete it.");
    }
    return index_shard_file(file, should_stop);
  }

  void discover_fields() {
    // The first intact sample defines the fields (shapes of .npy fields, default field list).
    const SampleEntry* first = nullptr;
    size_t first_shard = 0;
    for (const auto& [s, i] : table_) {
      const SampleEntry& e = shards_[s].index.samples[i];
      if (e.error.empty()) {
        first = &e;
        first_shard = s;
        break;
      }
    }
    TORCH_CHECK(first != nullptr, "torchspeed.data.WebDataset: no intact sample in '", opt_.urls[0],
                "'");
    std::vector<std::string> requested = opt_.fields;
    if (requested.empty()) {
      for (const auto& f : first->fields) {
        Kind k;
        if (kind_of(f.ext, &k)) requested.push_back(f.ext);
      }
      TORCH_CHECK(!requested.empty(), "torchspeed.data.WebDataset: sample '", first->key, "' of '",
                  opt_.urls[first_shard], "' has no recognised field");
    }
    for (const auto& spec : requested) {
      FieldSpec fs;
      fs.name = spec;
      if (spec == "__key__") {
        fs.is_string = true;
        key_field_ = specs_.size();
        specs_.push_back(fs);
        alternatives_.emplace_back();
        kinds_.push_back(Kind::kString);
        continue;
      }
      std::vector<std::string> alts = split(spec, ';');
      TORCH_CHECK(!alts.empty(), "torchspeed.data.WebDataset: fields must not contain empty specs");
      Kind kind;
      TORCH_CHECK(kind_of(alts[0], &kind), "torchspeed.data.WebDataset: fields entry '", spec,
                  "' has an unsupported extension (supported: jpg, jpeg, png, cls, cls2, id, ",
                  "index, txt, json, npy, and compound ones ending in these)");
      for (const auto& a : alts) {
        Kind k2;
        TORCH_CHECK(kind_of(a, &k2) && k2 == kind, "torchspeed.data.WebDataset: fields entry '",
                    spec, "' mixes kinds of fields");
      }
      switch (kind) {
        case Kind::kImage: {
          fs.dtype = opt_.image.to_float ? at::kFloat : at::kByte;
          const int64_t h = opt_.image.height, w = opt_.image.width;
          fs.shape = opt_.image.channels_last ? std::vector<int64_t>{h, w, 3}
                                              : std::vector<int64_t>{3, h, w};
          break;
        }
        case Kind::kLabel:
          fs.dtype = at::kLong;
          break;
        case Kind::kString:
          fs.is_string = true;
          break;
        case Kind::kNpy: {
          const SampleField* sf = nullptr;
          for (const auto& a : alts) {
            if ((sf = first->find(a)) != nullptr) break;
          }
          TORCH_CHECK(sf != nullptr, "torchspeed.data.WebDataset: shard '", opt_.urls[first_shard],
                      "' sample '", first->key, "': missing field '", spec,
                      "' (needed to learn the .npy shape)");
          std::vector<uint8_t> buf;
          const uint8_t* member = read_member(*shards_[first_shard].file, *sf, &buf);
          const NpyArray a = parse_npy(member, static_cast<size_t>(sf->size),
                                       opt_.urls[first_shard] + ":" + first->key + "." + sf->ext);
          fs.dtype = npy_to_torch(a.type);
          fs.shape = a.shape;
          break;
        }
      }
      specs_.push_back(fs);
      alternatives_.push_back(alts);
      kinds_.push_back(kind);
    }
    row_bytes_.clear();
    for (const auto& s : specs_) row_bytes_.push_back(s.is_string ? 0 : row_bytes(s));
  }

  void fill_field(size_t f, const std::string& ext, const uint8_t* data, size_t size, int64_t index,
                  int64_t row, const SlotView& slot, const FillContext& ctx) {
    const at::Tensor& t = (*slot.tensors)[f];
    switch (kinds_[f]) {
      case Kind::kImage: {
        StageTimes local;
        process_image(data, size, opt_.image, ctx.seed, ctx.epoch, static_cast<uint64_t>(index),
                      row_ptr(t, row, row_bytes_[f]), &local);
        if (ctx.times) {
          ctx.times->decode += local.decode;
          ctx.times->transform += local.transform;
        }
        break;
      }
      case Kind::kLabel: {
        auto t0 = Clock::now();
        std::string s(reinterpret_cast<const char*>(data), size);
        size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
        if (b == std::string::npos) throw std::runtime_error("empty ." + ext + " field");
        s = s.substr(b, e - b + 1);
        size_t used = 0;
        int64_t v = 0;
        try {
          v = std::stoll(s, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used != s.size())
          throw std::runtime_error("." + ext + " is not an integer: '" + s.substr(0, 40) + "'");
        std::memcpy(row_ptr(t, row, row_bytes_[f]), &v, sizeof(v));
        if (ctx.times) ctx.times->collate += seconds_since(t0);
        break;
      }
      case Kind::kString: {
        const std::string_view text(reinterpret_cast<const char*>(data), size);
        const size_t bad = first_invalid_utf8(text);
        if (bad != text.size()) {
          throw std::runtime_error("." + ext + " is not valid UTF-8 (byte " + std::to_string(bad) +
                                   " of " + std::to_string(size) + ")");
        }
        (*slot.strings)[f][static_cast<size_t>(row)].assign(text);
        break;
      }
      case Kind::kNpy: {
        auto t0 = Clock::now();
        const NpyArray a = parse_npy(data, size, ext);
        if (npy_to_torch(a.type) != specs_[f].dtype || a.shape != specs_[f].shape) {
          throw std::runtime_error("." + ext + " has dtype " + npy_type_name(a.type) + " shape " +
                                   c10::str(at::IntArrayRef(a.shape)) + ", expected " +
                                   c10::str(specs_[f].dtype) + " " +
                                   c10::str(at::IntArrayRef(specs_[f].shape)));
        }
        if (ctx.times) ctx.times->decode += seconds_since(t0);
        t0 = Clock::now();
        std::memcpy(row_ptr(t, row, row_bytes_[f]), data + a.data_offset, a.data_bytes);
        if (ctx.times) ctx.times->collate += seconds_since(t0);
        break;
      }
    }
  }

  WebDatasetOptions opt_;
  std::vector<Shard> shards_;
  std::vector<std::pair<uint32_t, uint32_t>> table_;  // global index -> (shard, sample)
  std::vector<FieldSpec> specs_;
  std::vector<std::vector<std::string>> alternatives_;
  std::vector<Kind> kinds_;
  std::vector<size_t> row_bytes_;
  size_t key_field_ = static_cast<size_t>(-1);
};

// ---------------------------------------------------------------------------------------------
class NpySource final : public Source {
 public:
  explicit NpySource(const std::vector<std::pair<std::string, std::string>>& fields) {
    TORCH_CHECK(!fields.empty(), "torchspeed.data.NpySource: at least one file is needed");
    for (const auto& [name, path] : fields) {
      Array a;
      a.file = std::make_unique<ReadOnlyFile>(path);
      // The header lies in the first bytes (a few hundred in practice); 1 MiB is plenty.
      std::vector<uint8_t> head(
          static_cast<size_t>(std::min<uint64_t>(a.file->size(), uint64_t{1} << 20)));
      a.file->read(0, head.size(), head.data());
      a.header = parse_npy_header(head.data(), head.size(), a.file->size(), path);
      TORCH_CHECK(!a.header.shape.empty(), "torchspeed.data.NpySource: '", path,
                  "' must have at least one dimension (the sample dimension), got a scalar");
      if (arrays_.empty()) {
        n_ = a.header.shape[0];
      } else {
        TORCH_CHECK(a.header.shape[0] == n_, "torchspeed.data.NpySource: '", path, "' has ",
                    a.header.shape[0], " samples, expected ", n_, " like '", fields[0].second, "'");
      }
      FieldSpec fs;
      fs.name = name;
      fs.dtype = npy_to_torch(a.header.type);
      fs.shape.assign(a.header.shape.begin() + 1, a.header.shape.end());
      a.row_bytes = row_bytes(fs);
      specs_.push_back(fs);
      arrays_.push_back(std::move(a));
    }
  }
  int64_t size() const override { return n_; }
  const std::vector<FieldSpec>& fields() const override { return specs_; }
  void fill(int64_t index, int64_t row, const SlotView& slot, const FillContext& ctx) override {
    auto t0 = Clock::now();
    for (size_t f = 0; f < arrays_.size(); ++f) {
      const Array& a = arrays_[f];
      // Straight into the slot; a file truncated or rewritten under the loader throws here.
      try {
        a.file->read(a.header.data_offset + static_cast<uint64_t>(index) * a.row_bytes, a.row_bytes,
                     row_ptr((*slot.tensors)[f], row, a.row_bytes));
      } catch (const std::exception& e) {
        throw std::runtime_error("sample " + std::to_string(index) + ": " + e.what());
      }
    }
    if (ctx.times) ctx.times->read += seconds_since(t0);
  }

 private:
  struct Array {
    std::unique_ptr<ReadOnlyFile> file;
    NpyArray header;
    size_t row_bytes = 0;
  };
  std::vector<Array> arrays_;
  std::vector<FieldSpec> specs_;
  int64_t n_ = 0;
};

// ---------------------------------------------------------------------------------------------
class TensorSource final : public Source {
 public:
  explicit TensorSource(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
    TORCH_CHECK(!tensors.empty(), "torchspeed.data.TensorSource: at least one tensor is needed");
    for (const auto& [name, t] : tensors) {
      TORCH_CHECK(t.defined() && t.device().is_cpu() && t.dim() >= 1,
                  "torchspeed.data.TensorSource: tensor '", name,
                  "' must be a CPU tensor with a sample dimension, got ",
                  t.defined() ? c10::str(t.options(), " of shape ", t.sizes()) : "undefined");
      if (tensors_.empty()) n_ = t.size(0);
      TORCH_CHECK(t.size(0) == n_, "torchspeed.data.TensorSource: tensor '", name, "' has ",
                  t.size(0), " samples, expected ", n_);
      FieldSpec fs;
      fs.name = name;
      fs.dtype = t.scalar_type();
      fs.shape.assign(t.sizes().begin() + 1, t.sizes().end());
      specs_.push_back(fs);
      tensors_.push_back(t.contiguous());
    }
  }
  int64_t size() const override { return n_; }
  const std::vector<FieldSpec>& fields() const override { return specs_; }
  bool batched() const override { return true; }
  void fill(int64_t index, int64_t row, const SlotView& slot, const FillContext& ctx) override {
    fill_batch({index}, slot, ctx);  // not used by the loader (batched() is true)
    (void)row;
  }
  void fill_batch(const std::vector<int64_t>& indices, const SlotView& slot,
                  const FillContext& ctx) override {
    auto t0 = Clock::now();
    const int64_t n = static_cast<int64_t>(indices.size());
    at::Tensor idx = at::from_blob(const_cast<int64_t*>(indices.data()), {n}, at::kLong);
    for (size_t f = 0; f < tensors_.size(); ++f) {
      at::Tensor out = (*slot.tensors)[f].narrow(0, 0, n);
      at::index_select_out(out, tensors_[f], 0, idx);
    }
    if (ctx.times) ctx.times->collate += seconds_since(t0);
  }

 private:
  std::vector<at::Tensor> tensors_;
  std::vector<FieldSpec> specs_;
  int64_t n_ = 0;
};

}  // namespace

std::shared_ptr<Source> webdataset_source(const WebDatasetOptions& options) {
  try {
    return std::make_shared<WebDatasetSource>(options);
  } catch (const c10::Error&) {
    throw;
  } catch (const Cancelled&) {
    throw;  // the caller's should_stop asked for it; not a data error
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "torchspeed.data.WebDataset: ", e.what());
  }
}

std::shared_ptr<Source> npy_source(const std::vector<std::pair<std::string, std::string>>& fields) {
  try {
    return std::make_shared<NpySource>(fields);
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "torchspeed.data.NpySource: ", e.what());
  }
}

std::shared_ptr<Source> tensor_source(const std::vector<std::pair<std::string, at::Tensor>>& t) {
  return std::make_shared<TensorSource>(t);
}

int64_t source_size(const Source& source) { return source.size(); }

ShardIndex index_shard_file(const ReadOnlyFile& file, const std::function<bool()>& should_stop) {
  const ReadAt read = [&file](uint64_t offset, size_t n, uint8_t* out) {
    file.read(offset, n, out, false);
  };
  ShardIndex index = ShardIndex::build(file.size(), read, file.path(), should_stop);
  // A shard that changed while it was scanned could give an index of neither version.
  file.check_unchanged();
  index.shard_mtime_ns = file.mtime_ns();
  return index;
}

int64_t write_shard_index(const std::string& shard, const std::function<bool()>& should_stop) {
  const ReadOnlyFile f(shard);
  const ShardIndex idx = index_shard_file(f, should_stop);
  for (const auto& s : idx.samples) {
    if (!s.error.empty()) throw std::runtime_error(s.error);
  }
  const std::string bytes = idx.serialize();
  // Written next to the final name and renamed, so a reader never sees half an index.
  torchspeed::atomic_write_file(shard + ".idx", bytes, "torchspeed.data.write_shard_index");
  return static_cast<int64_t>(idx.samples.size());
}

}  // namespace torchspeed::data
