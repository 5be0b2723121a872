// Torch-free tar parser and WebDataset grouping; every read is bounds-checked (fuzzed by
// tests/fuzz).
#include "data/tar_reader.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace torchspeed::data {
namespace {

constexpr size_t kBlock = 512;

std::string field_string(const uint8_t* p, size_t n) {
  size_t len = 0;
  while (len < n && p[len] != 0) ++len;
  return std::string(reinterpret_cast<const char*>(p), len);
}

// Octal (space/NUL padded) or GNU base-256 numeric field; returns false if malformed.
bool parse_numeric(const uint8_t* p, size_t n, uint64_t* out) {
  if (n > 0 && (p[0] & 0x80)) {     // base-256
    if (p[0] & 0x40) return false;  // negative
    uint64_t v = p[0] & 0x3f;
    for (size_t i = 1; i < n; ++i) {
      if (v >> 56) return false;  // overflow
      v = (v << 8) | p[i];
    }
    *out = v;
    return true;
  }
  size_t i = 0;
  while (i < n && (p[i] == ' ' || p[i] == 0)) ++i;
  uint64_t v = 0;
  bool any = false;
  for (; i < n && p[i] >= '0' && p[i] <= '7'; ++i) {
    if (v >> 60) return false;
    v = (v << 3) | static_cast<uint64_t>(p[i] - '0');
    any = true;
  }
  for (; i < n; ++i) {
    if (p[i] != ' ' && p[i] != 0) return false;
  }
  *out = any ? v : 0;
  return true;
}

bool is_zero_block(const uint8_t* p) {
  for (size_t i = 0; i < kBlock; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

[[noreturn]] void fail(const std::string& shard, const std::string& what) {
  throw std::runtime_error("torchspeed.data.tar: shard '" + shard + "': " + what);
}

// Extracts "path" from pax records "<len> key=value\n".
bool pax_path(const uint8_t* p, size_t n, std::string* path) {
  size_t pos = 0;
  bool found = false;
  while (pos < n) {
    size_t len = 0, i = pos;
    while (i < n && p[i] >= '0' && p[i] <= '9') {
      if (len > n) return found;
      len = len * 10 + static_cast<size_t>(p[i] - '0');
      ++i;
    }
    if (len == 0 || i >= n || p[i] != ' ' || len > n - pos) return found;
    std::string rec(reinterpret_cast<const char*>(p + i + 1), pos + len - (i + 1));
    if (!rec.empty() && rec.back() == '\n') rec.pop_back();
    auto eq = rec.find('=');
    if (eq != std::string::npos && rec.compare(0, eq, "path") == 0) {
      *path = rec.substr(eq + 1);
      found = true;
    }
    pos += len;
  }
  return found;
}

}  // namespace

namespace {

// Bytes of the tar being scanned. get() returns a pointer valid until the next call; callers have
// checked that [offset, offset + n) lies inside the tar.
class TarBytes {
 public:
  virtual ~TarBytes() = default;
  virtual const uint8_t* get(uint64_t offset, size_t n) = 0;
};

class MemoryBytes final : public TarBytes {
 public:
  explicit MemoryBytes(const uint8_t* data) : data_(data) {}
  const uint8_t* get(uint64_t offset, size_t) override { return data_ + offset; }

 private:
  const uint8_t* data_;
};

// Reads headers in small windows: consecutive small members share one read, large members cost
// one header-sized read each (their data is skipped, not read).
class FileBytes final : public TarBytes {
 public:
  static constexpr size_t kWindow = 16384;
  FileBytes(uint64_t size, const ReadAt& read) : size_(size), read_(read), window_(kWindow) {}
  const uint8_t* get(uint64_t offset, size_t n) override {
    if (offset >= start_ && n <= len_ && offset - start_ <= len_ - n) {
      return window_.data() + (offset - start_);
    }
    if (n > kWindow) {
      big_.resize(n);
      read_(offset, n, big_.data());
      return big_.data();
    }
    const size_t len = static_cast<size_t>(std::min<uint64_t>(kWindow, size_ - offset));
    len_ = 0;  // stays invalid if the read throws
    read_(offset, len, window_.data());
    start_ = offset;
    len_ = len;
    return window_.data();
  }

 private:
  uint64_t size_;
  const ReadAt& read_;
  std::vector<uint8_t> window_, big_;
  uint64_t start_ = 0;
  size_t len_ = 0;
};

// GNU long names and pax records are read whole; real ones are a few hundred bytes.
constexpr uint64_t kMaxExtendedHeader = uint64_t{1} << 20;
// How often (in headers) a long scan polls its should_stop hook.
constexpr size_t kStopPollInterval = 256;

// Appends the members to *out; `*current` names the member being parsed when an error is thrown.
void scan_tar(TarBytes& bytes, uint64_t size, const std::string& shard, std::vector<TarMember>* out,
              std::string* current, const std::function<bool()>& should_stop) {
  uint64_t pos = 0;
  std::string long_name;
  bool have_long_name = false;
  for (size_t n_headers = 0;; ++n_headers) {
    current->clear();
    if (should_stop && n_headers % kStopPollInterval == kStopPollInterval - 1 && should_stop()) {
      throw Cancelled("torchspeed.data: indexing of shard '" + shard + "' was cancelled");
    }
    if (pos == size) break;  // tolerate a missing end-of-archive marker at a block boundary
    if (size - pos < kBlock) {
      fail(shard, "truncated header at offset " + std::to_string(pos) + " (file has " +
                      std::to_string(size) + " bytes)");
    }
    const uint8_t* h = bytes.get(pos, kBlock);
    if (is_zero_block(h)) break;  // end of archive
    uint64_t stored_sum = 0;
    if (!parse_numeric(h + 148, 8, &stored_sum)) {
      fail(shard, "bad header checksum field at offset " + std::to_string(pos));
    }
    uint64_t sum = 0;
    for (size_t i = 0; i < kBlock; ++i) sum += (i >= 148 && i < 156) ? 0x20 : h[i];
    std::string name = field_string(h, 100);
    *current = have_long_name ? long_name : name;
    if (sum != stored_sum) {
      fail(shard, "header checksum mismatch at offset " + std::to_string(pos) + " (member '" +
                      name + "'); not a tar file or corrupt");
    }
    if (std::memcmp(h + 257, "ustar", 5) == 0) {
      std::string prefix = field_string(h + 345, 155);
      if (!prefix.empty()) name = prefix + "/" + name;
    }
    *current = have_long_name ? long_name : name;
    uint64_t msize = 0;
    if (!parse_numeric(h + 124, 12, &msize))
      fail(shard, "bad size field for member '" + *current + "'");
    const char type = static_cast<char>(h[156]);
    const uint64_t hash = tar_header_hash(h);  // h is invalid after the next bytes.get()
    const uint64_t data_pos = pos + kBlock;
    if (msize > size - data_pos) {
      fail(shard, "member '" + *current + "' is truncated (needs " + std::to_string(msize) +
                      " bytes at offset " + std::to_string(data_pos) + ", file has " +
                      std::to_string(size) + ")");
    }
    if (type == 'L' || type == 'x') {
      if (msize > kMaxExtendedHeader) {
        fail(shard, "extended header of " + std::to_string(msize) + " bytes at offset " +
                        std::to_string(pos) + " is larger than 1 MiB");
      }
      const uint8_t* body = bytes.get(data_pos, static_cast<size_t>(msize));
      if (type == 'L') {  // GNU long name for the next member
        long_name = field_string(body, static_cast<size_t>(msize));
        have_long_name = true;
      } else {  // pax header for the next member
        std::string p;
        if (pax_path(body, static_cast<size_t>(msize), &p)) {
          long_name = p;
          have_long_name = true;
        }
      }
    } else if (type == '0' || type == '\0' || type == '7') {
      TarMember m;
      m.name = *current;
      m.offset = data_pos;
      m.size = msize;
      m.header_hash = hash;
      out->push_back(std::move(m));
      have_long_name = false;
    } else {
      have_long_name = false;  // directories, links, pax globals, ...: skipped
    }
    const uint64_t padded = (msize + kBlock - 1) / kBlock * kBlock;
    // Data that fits without its padding is accepted only as the last member.
    pos = padded > size - data_pos ? size : data_pos + padded;
  }
  current->clear();
}

std::vector<TarMember> list_members(TarBytes& bytes, uint64_t size, const std::string& shard,
                                    std::string* stop_error, std::string* stop_name,
                                    const std::function<bool()>& should_stop) {
  std::vector<TarMember> out;
  std::string current;
  if (stop_error == nullptr) {
    scan_tar(bytes, size, shard, &out, &current, should_stop);
    return out;
  }
  try {
    scan_tar(bytes, size, shard, &out, &current, should_stop);
  } catch (const Cancelled&) {
    throw;  // not damage: the caller asked to stop
  } catch (const std::runtime_error& e) {
    *stop_error = e.what();
    if (stop_name != nullptr) *stop_name = current;
  }
  return out;
}

ShardIndex group_samples(const std::vector<TarMember>& members, uint64_t size,
                         const std::string& shard, const std::string& stop_error,
                         const std::string& stop_name) {
  ShardIndex idx;
  idx.shard_size = size;
  for (const auto& m : members) {
    std::string key, ext;
    if (!split_webdataset_name(m.name, &key, &ext)) continue;
    if (idx.samples.empty() || idx.samples.back().key != key) {
      idx.samples.push_back(SampleEntry{key, {}, {}});
    }
    auto& s = idx.samples.back();
    if (s.find(ext) != nullptr) {
      fail(shard, "sample '" + key + "': duplicate file '" + m.name + "'");
    }
    s.fields.push_back(SampleField{ext, m.offset, m.size, m.header_hash});
  }
  if (!stop_error.empty()) {
    std::string key, ext;
    if (!split_webdataset_name(stop_name, &key, &ext)) {
      key = stop_name.empty() ? "<after the last sample>" : stop_name;
    }
    if (idx.samples.empty() || idx.samples.back().key != key) {
      idx.samples.push_back(SampleEntry{key, {}, {}});
    }
    idx.samples.back().error = stop_error;
  }
  return idx;
}

}  // namespace

uint64_t tar_header_hash(const uint8_t* header) {
  // FNV-1a over 64-bit words, then a final avalanche; not cryptographic, it only has to tell
  // different headers apart.
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < kBlock; i += 8) {
    uint64_t w = 0;
    std::memcpy(&w, header + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

std::vector<TarMember> list_tar_members(const uint8_t* data, size_t size, const std::string& shard,
                                        std::string* stop_error, std::string* stop_name) {
  MemoryBytes bytes(data);
  return list_members(bytes, size, shard, stop_error, stop_name, {});
}

std::vector<TarMember> list_tar_members(uint64_t size, const ReadAt& read, const std::string& shard,
                                        std::string* stop_error, std::string* stop_name,
                                        const std::function<bool()>& should_stop) {
  FileBytes bytes(size, read);
  return list_members(bytes, size, shard, stop_error, stop_name, should_stop);
}

bool split_webdataset_name(const std::string& name, std::string* key, std::string* ext) {
  const size_t slash = name.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = name.find('.', base);
  if (dot == std::string::npos || dot == base) return false;  // no extension or hidden file
  if (dot + 1 >= name.size()) return false;
  *key = name.substr(0, dot);
  *ext = name.substr(dot + 1);
  std::transform(ext->begin(), ext->end(), ext->begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return true;
}

ShardIndex ShardIndex::build(const uint8_t* data, size_t size, const std::string& shard) {
  std::string stop_error, stop_name;
  const auto members = list_tar_members(data, size, shard, &stop_error, &stop_name);
  return group_samples(members, size, shard, stop_error, stop_name);
}

ShardIndex ShardIndex::build(uint64_t size, const ReadAt& read, const std::string& shard,
                             const std::function<bool()>& should_stop) {
  std::string stop_error, stop_name;
  const auto members = list_tar_members(size, read, shard, &stop_error, &stop_name, should_stop);
  return group_samples(members, size, shard, stop_error, stop_name);
}

namespace {
// "TSIDX" + a three-digit format version. Version 3 added the shard's modification time and a
// hash of each member's tar header.
constexpr char kMagic[8] = {'T', 'S', 'I', 'D', 'X', '0', '0', '3'};
constexpr size_t kMagicPrefix = 5;

template <typename T>
void put(std::string* s, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

struct Cursor {
  const uint8_t* p;
  size_t n;
  size_t pos = 0;
  const std::string& where;
  [[noreturn]] void bad(const std::string& what) const {
    throw std::runtime_error("torchspeed.data.index: '" + where + "': " + what + " at byte " +
                             std::to_string(pos));
  }
  template <typename T>
  T get() {
    if (n - pos < sizeof(T)) bad("unexpected end of index");
    T v = 0;
    for (size_t i = 0; i < sizeof(T); ++i)
      v |= static_cast<T>(static_cast<T>(p[pos + i]) << (8 * i));
    pos += sizeof(T);
    return v;
  }
  std::string bytes(size_t len) {
    if (n - pos < len) bad("unexpected end of index");
    std::string s(reinterpret_cast<const char*>(p + pos), len);
    pos += len;
    return s;
  }
};
}  // namespace

std::string ShardIndex::serialize() const {
  std::string s(kMagic, sizeof(kMagic));
  put<uint64_t>(&s, shard_size);
  put<uint64_t>(&s, static_cast<uint64_t>(shard_mtime_ns));
  put<uint64_t>(&s, samples.size());
  for (const auto& e : samples) {
    put<uint32_t>(&s, static_cast<uint32_t>(e.key.size()));
    s += e.key;
    put<uint32_t>(&s, static_cast<uint32_t>(e.error.size()));
    s += e.error;
    put<uint32_t>(&s, static_cast<uint32_t>(e.fields.size()));
    for (const auto& f : e.fields) {
      put<uint16_t>(&s, static_cast<uint16_t>(f.ext.size()));
      s += f.ext;
      put<uint64_t>(&s, f.offset);
      put<uint64_t>(&s, f.size);
      put<uint64_t>(&s, f.header_hash);
    }
  }
  return s;
}

ShardIndex ShardIndex::deserialize(const uint8_t* data, size_t size, const std::string& where) {
  Cursor c{data, size, 0, where};
  if (size < sizeof(kMagic) || std::memcmp(data, kMagic, kMagicPrefix) != 0) {
    c.bad("not a torchspeed shard index (bad magic)");
  }
  if (std::memcmp(data, kMagic, sizeof(kMagic)) != 0) {
    c.bad("index format version '" +
          std::string(reinterpret_cast<const char*>(data) + kMagicPrefix, 3) +
          "' is not supported (this build reads version '" + std::string(kMagic + kMagicPrefix, 3) +
          "'); write the index again");
  }
  c.pos = sizeof(kMagic);
  ShardIndex idx;
  idx.shard_size = c.get<uint64_t>();
  idx.shard_mtime_ns = static_cast<int64_t>(c.get<uint64_t>());
  const uint64_t count = c.get<uint64_t>();
  // Each sample needs at least 12 bytes, so a huge count cannot make us allocate.
  if (count > (size - c.pos) / 12) c.bad("sample count " + std::to_string(count) + " too large");
  idx.samples.reserve(static_cast<size_t>(count));
  for (uint64_t i = 0; i < count; ++i) {
    SampleEntry e;
    const uint32_t klen = c.get<uint32_t>();
    e.key = c.bytes(klen);
    const uint32_t error_len = c.get<uint32_t>();
    e.error = c.bytes(error_len);
    const uint32_t nf = c.get<uint32_t>();
    // Each field needs at least 26 bytes.
    if (nf > (size - c.pos) / 26) c.bad("field count " + std::to_string(nf) + " too large");
    for (uint32_t j = 0; j < nf; ++j) {
      SampleField f;
      const uint16_t ext_len = c.get<uint16_t>();
      f.ext = c.bytes(ext_len);
      f.offset = c.get<uint64_t>();
      f.size = c.get<uint64_t>();
      f.header_hash = c.get<uint64_t>();
      // The member's tar header (512 bytes) precedes its data and is checked on every read.
      if (f.offset < 512 || f.offset > idx.shard_size || f.size > idx.shard_size - f.offset) {
        c.bad("field '" + e.key + "." + f.ext + "' lies outside the shard");
      }
      if (e.find(f.ext) != nullptr) c.bad("duplicate field '" + e.key + "." + f.ext + "'");
      e.fields.push_back(std::move(f));
    }
    idx.samples.push_back(std::move(e));
  }
  if (c.pos != size) c.bad("trailing bytes");
  return idx;
}

}  // namespace torchspeed::data
