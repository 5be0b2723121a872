// Torch-free epoch ordering: seeded shuffle, distributed sharding (drop or pad) and batching.
#pragma once

#include <cstdint>
#include <vector>

#include "torchspeed/export.h"

namespace torchspeed::data {

// The sample indices one rank visits in `epoch`: a permutation of [0, n) from (seed, epoch) when
// shuffle is set (identity otherwise); then, for world_size > 1, the list is cut to a multiple of
// world_size (drop_uneven) or padded by repeating its beginning (like DistributedSampler), and the
// rank takes every world_size-th element starting at rank.
TORCHSPEED_API std::vector<int64_t> epoch_indices(int64_t n, bool shuffle, uint64_t seed,
                                                  uint64_t epoch, int rank, int world_size,
                                                  bool drop_uneven);

// Number of batches for `count` samples.
inline int64_t batch_count(int64_t count, int64_t batch_size, bool drop_last) {
  return drop_last ? count / batch_size : (count + batch_size - 1) / batch_size;
}

}  // namespace torchspeed::data
