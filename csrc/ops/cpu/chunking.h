// Work splitting shared by the multi-tensor CPU ops: every tensor is cut into chunks of at most
// kChunkElements, and one parallel region runs over all chunks of all tensors, so many small
// tensors are batched and large ones split across threads.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace torchspeed::ops {

/// Big enough to amortise a kernel call (~tens of ns), small enough to balance 2..64 threads.
constexpr int64_t kChunkElements = 1 << 16;
// Chunks start on a quantization block of int8 optimizer moments (blocks of at most 4096).
static_assert(kChunkElements % 4096 == 0, "chunks must start on a state block");
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
/// Each thread gets a contiguous run of chunks holding about total/threads elements (balanced by
/// elements, not by chunk count: a model's many small biases must not pile up on one thread).
template <class Fn>
void parallel_over_chunks(const std::vector<Chunk>& chunks, Fn&& fn) {
  const int64_t n = static_cast<int64_t>(chunks.size());
  std::vector<int64_t> start(static_cast<size_t>(n) + 1, 0);  // element offset of each chunk
  for (int64_t i = 0; i < n; ++i) start[i + 1] = start[i] + chunks[i].length;
  const int64_t total = start[n];
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), n);
  if (total < kSerialElements || threads <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(chunks[i], static_cast<size_t>(i));
    return;
  }
  at::parallel_for(0, threads, 1, [&](int64_t t_begin, int64_t t_end) {
    // Thread t takes the chunks that start in [total * t / threads, total * (t + 1) / threads).
    auto first_chunk = [&](int64_t t) {
      const int64_t offset = total * t / threads;
      return std::lower_bound(start.begin(), start.end() - 1, offset) - start.begin();
    };
    const int64_t end = first_chunk(t_end);
    for (int64_t i = first_chunk(t_begin); i < end; ++i) fn(chunks[i], static_cast<size_t>(i));
  });
}

}  // namespace torchspeed::ops
