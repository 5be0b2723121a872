// Private interface of loader sources: what a sample looks like and how it is written into a slot.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "image.h"
#include "torchspeed/data/loader.h"

namespace torchspeed {
namespace data {

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
  // Skipped-on-error samples that the source knows about up front (damaged tar ranges).
  virtual std::string describe(int64_t index) const { return "sample " + std::to_string(index); }
};

}  // namespace data
}  // namespace torchspeed
