// Work splitting shared by the multi-tensor CPU ops: every tensor is cut into chunks of at most
// kChunkElements, and one parallel region runs over all chunks of all tensors, so many small
// tensors are batched and large ones split across threads.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <vector>

namespace torchspeed::ops {

/// Big enough to amortise a kernel call (~tens of ns), small enough to balance 2..64 threads.
constexpr int64_t kChunkElements = 1 << 16;
/// Below this many elements in total, one thread does everything (no fork/join).
constexpr int64_t kSerialElements = 1 << 15;

struct Chunk {
  size_t tensor;
  int64_t begin;
  int64_t length;
};

inline std::vector<Chunk> make_chunks(const std::vector<at::Tensor>& tensors) {
  std::vector<Chunk> chunks;
  chunks.reserve(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    const int64_t n = tensors[t].numel();
    for (int64_t b = 0; b < n; b += kChunkElements) {
      chunks.push_back({t, b, n - b < kChunkElements ? n - b : kChunkElements});
    }
  }
  return chunks;
}

/// Calls fn(chunk, index) for every chunk, in parallel when the total work is large enough.
/// Chunks are handed out in contiguous runs of about equal element counts per thread.
template <class Fn>
void parallel_over_chunks(const std::vector<Chunk>& chunks, Fn&& fn) {
  int64_t total = 0;
  for (const auto& c : chunks) total += c.length;
  const int64_t n = static_cast<int64_t>(chunks.size());
  if (total < kSerialElements || at::get_num_threads() <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(chunks[i], static_cast<size_t>(i));
    return;
  }
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) fn(chunks[i], static_cast<size_t>(i));
  });
}

}  // namespace torchspeed::ops
