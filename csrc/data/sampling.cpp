// Torch-free epoch ordering (seeded Fisher-Yates from the counter-based generator, rank sharding).
#include "data/sampling.h"

#include <numeric>
#include <stdexcept>
#include <string>

#include "data/rng.h"

namespace torchspeed::data {

std::vector<int64_t> epoch_indices(int64_t n, bool shuffle, uint64_t seed, uint64_t epoch, int rank,
                                   int world_size, bool drop_uneven) {
  if (n < 0)
    throw std::invalid_argument("torchspeed.data.sampler: n must be >= 0, got " +
                                std::to_string(n));
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw std::invalid_argument(
        "torchspeed.data.sampler: rank must be in [0, world_size), got rank " +
        std::to_string(rank) + ", world_size " + std::to_string(world_size));
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (shuffle) {
    SampleRng rng(seed, epoch, 0, RngPurpose::kShuffle);
    for (int64_t i = n - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
    }
  }
  if (world_size == 1) return order;
  int64_t total =
      drop_uneven ? n / world_size * world_size : (n + world_size - 1) / world_size * world_size;
  if (n == 0) total = 0;
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(total / world_size));
  for (int64_t i = rank; i < total; i += world_size)
    mine.push_back(order[static_cast<size_t>(i % n)]);
  return mine;
}

}  // namespace torchspeed::data
