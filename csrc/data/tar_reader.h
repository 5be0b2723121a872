// Torch-free tar parser (ustar, GNU long names, pax paths) and WebDataset sample grouping/indexing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "torchspeed/data/options.h"
#include "torchspeed/export.h"

namespace torchspeed::data {

// One regular file inside a tar: its name and where its bytes are.
struct TarMember {
  std::string name;
  uint64_t offset = 0;  // byte offset of the data in the tar (its header is the block before)
  uint64_t size = 0;
  uint64_t header_hash = 0;  // tar_header_hash of that header block
};

// Fingerprint of a 512-byte tar header block (name, size, mtime, checksum, ...). Stored per member
// in the index and compared on every read, so a shard rewritten after indexing is not read through
// an index that points at other members.
TORCHSPEED_API uint64_t tar_header_hash(const uint8_t* header);

// The indexing functions throw Cancelled (torchspeed/data/options.h) when their `should_stop` hook
// returns true (e.g. Ctrl-C).

// Reads exactly `n` bytes at `offset` into `out` or throws std::runtime_error (a file that
// shrank, an I/O error). Lets the tar scanner read files with pread instead of mapping them.
using ReadAt = std::function<void(uint64_t offset, size_t n, uint8_t* out)>;

// Lists the regular files of a tar held in memory. Directories, links and pax globals are skipped.
// Throws std::runtime_error naming `shard` (and the member) on a bad checksum, a bad size field or
// a member that runs past the end (truncated tar).
// With `stop_error` set, a damaged archive is not an error: the members before the damage are
// returned, *stop_error gets the message and *stop_name the damaged member's name ("" if unknown).
TORCHSPEED_API std::vector<TarMember> list_tar_members(const uint8_t* data, size_t size,
                                                       const std::string& shard,
                                                       std::string* stop_error = nullptr,
                                                       std::string* stop_name = nullptr);
// The same for a tar of `size` bytes read through `read` (headers are fetched in small windows, so
// member data is not read). `should_stop`, when set, is polled regularly; true throws Cancelled.
TORCHSPEED_API std::vector<TarMember> list_tar_members(
    uint64_t size, const ReadAt& read, const std::string& shard, std::string* stop_error = nullptr,
    std::string* stop_name = nullptr, const std::function<bool()>& should_stop = {});

// WebDataset naming: key = path up to the first dot of the basename, extension = the rest
// (lower-cased). Returns false for names without an extension (such members are ignored).
TORCHSPEED_API bool split_webdataset_name(const std::string& name, std::string* key,
                                          std::string* ext);

struct SampleField {
  std::string ext;  // "jpg", "cls", "seg.png", ...
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t header_hash = 0;  // of the member's tar header (the 512 bytes before `offset`)
};

struct SampleEntry {
  std::string key;
  std::vector<SampleField> fields;
  std::string error;  // non-empty: the tar is damaged at this sample (reading it raises this)
  const SampleField* find(const std::string& ext) const {
    for (const auto& f : fields) {
      if (f.ext == ext) return &f;
    }
    return nullptr;
  }
};

// The samples of one shard: consecutive members with the same key form a sample (WebDataset's
// group_by_keys); a repeated extension inside one sample is an error naming shard and key.
// A truncated or corrupt tar does not fail the build: the samples before the damage are kept and
// the damaged sample (or a "<offset N>" placeholder) carries the error, so the loader reports it
// when that sample is read (raise) or counts it (skip).
// An index saved next to a shard records the shard's size and modification time; a loader trusts
// it only when both still match, and every member read checks the member's header hash, so an
// index that went stale in an undetected way gives an error instead of another member's bytes.
struct TORCHSPEED_API ShardIndex {
  uint64_t shard_size = 0;
  int64_t shard_mtime_ns = 0;  // 0 when built from memory
  std::vector<SampleEntry> samples;

  static ShardIndex build(const uint8_t* data, size_t size, const std::string& shard);
  // Builds from a file read through `read` (see list_tar_members); `should_stop` can cancel.
  static ShardIndex build(uint64_t size, const ReadAt& read, const std::string& shard,
                          const std::function<bool()>& should_stop = {});
  // Compact binary form (format version 3), so an index file next to a shard avoids rescanning it.
  std::string serialize() const;
  // Validates everything (format version, bounds against shard_size, lengths, counts); throws
  // std::runtime_error naming `where` on any inconsistency, including an older format version.
  static ShardIndex deserialize(const uint8_t* data, size_t size, const std::string& where);
};

}  // namespace torchspeed::data
