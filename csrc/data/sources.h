// Private interface of loader sources: what a sample looks like and how it is written into a slot.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/image.h"
#include "data/mapped_file.h"
#include "data/tar_reader.h"
#include "torchspeed/data/loader.h"

namespace torchspeed::data {

struct FieldSpec {
  std::string name;
  bool is_string = false;            // string fields go to Batch::strings
  at::ScalarType dtype = at::kByte;  // tensor fields
  std::vector<int64_t> shape;        // per-sample shape (without the batch dimension)
};

struct FillContext {
  uint64_t seed = 0;
  uint64_t epoch = 0;
  StageTimes* times = nullptr;
};

// Row-addressable destination of one batch: tensors[i] / strings[i] belong to fields()[i].
struct SlotView {
  std::vector<at::Tensor>* tensors;
  std::vector<std::vector<std::string>>* strings;
};

class Source {
 public:
  virtual ~Source() = default;
  virtual int64_t size() const = 0;
  virtual const std::vector<FieldSpec>& fields() const = 0;
  // Writes sample `index` into row `row`. Data errors throw std::runtime_error whose message
  // starts with "shard '<path>' sample '<key>': ".
  virtual void fill(int64_t index, int64_t row, const SlotView& slot, const FillContext& ctx) = 0;
  // Sources that gather whole batches at once (in-memory tensors) return true and implement
  // fill_batch instead of fill.
  virtual bool batched() const { return false; }
  virtual void fill_batch(const std::vector<int64_t>& indices, const SlotView& slot,
                          const FillContext& ctx) {
    for (size_t r = 0; r < indices.size(); ++r)
      fill(indices[r], static_cast<int64_t>(r), slot, ctx);
  }
  // How errors name sample `index` ("shard 'a.tar' sample 'k0004'").
  virtual std::string describe(int64_t index) const { return "sample " + std::to_string(index); }
};

// The index of one shard file, scanned with pread (`should_stop` polled; true throws Cancelled),
// refused if the file changed during the scan.
TORCHSPEED_API ShardIndex index_shard_file(const ReadOnlyFile& file,
                                           const std::function<bool()>& should_stop);

}  // namespace torchspeed::data
