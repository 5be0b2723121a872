// Torch-free tar parser (ustar, GNU long names, pax paths) and WebDataset sample grouping/indexing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "torchspeed/export.h"

namespace torchspeed {
namespace data {

// One regular file inside a tar: its name and where its bytes are.
struct TarMember {
  std::string name;
  uint64_t offset = 0;  // byte offset of the data in the tar
  uint64_t size = 0;
};

// Lists the regular files of a tar held in memory. Directories, links and pax globals are skipped.
// Throws std::runtime_error naming `shard` (and the member) on a bad checksum, a bad size field or
// a member that runs past the end (truncated tar).
// With `stop_error` set, a damaged archive is not an error: the members before the damage are
// returned, *stop_error gets the message and *stop_name the damaged member's name ("" if unknown).
TORCHSPEED_API std::vector<TarMember> list_tar_members(const uint8_t* data, size_t size,
                                                       const std::string& shard,
                                                       std::string* stop_error = nullptr,
                                                       std::string* stop_name = nullptr);

// WebDataset naming: key = path up to the first dot of the basename, extension = the rest
// (lower-cased). Returns false for names without an extension (such members are ignored).
TORCHSPEED_API bool split_webdataset_name(const std::string& name, std::string* key,
                                          std::string* ext);

struct SampleField {
  std::string ext;  // "jpg", "cls", "seg.png", ...
  uint64_t offset = 0;
  uint64_t size = 0;
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
struct TORCHSPEED_API ShardIndex {
  uint64_t shard_size = 0;
  std::vector<SampleEntry> samples;

  static ShardIndex build(const uint8_t* data, size_t size, const std::string& shard);
  // Compact binary form, so an index file next to a shard avoids rescanning it.
  std::string serialize() const;
  // Validates everything (bounds against shard_size, lengths, counts); throws std::runtime_error
  // naming `where` on any inconsistency.
  static ShardIndex deserialize(const uint8_t* data, size_t size, const std::string& where);
};

}  // namespace data
}  // namespace torchspeed
