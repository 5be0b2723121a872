// The error policy, applied to a finished batch by the worker that finished it: on_error="raise"
// keeps the first failing row's message for the consumer; "skip" compacts the good rows to the
// front, in order, so batches are the same for any worker count.
#include <cstring>

#include "data/loader_impl.h"

namespace torchspeed::data {

// Applies the error policy to a complete batch (only the finishing worker touches it).
void Loader::Impl::finalize(InFlight* b, Slot* slot) {
  const int64_t rows = static_cast<int64_t>(b->indices.size());
  int64_t bad = 0;
  for (const auto& e : b->errors) bad += !e.empty();
  b->valid_rows = rows;
  if (bad == 0) return;
  if (!skip_errors) {
    for (const auto& e : b->errors) {
      if (!e.empty()) {
        b->error = e;
        break;
      }
    }
    return;
  }
  // Skip: compact the good rows to the front, in order (deterministic for any worker count).
  auto t0 = Clock::now();
  int64_t dst = 0;
  std::vector<int64_t> kept;
  for (int64_t r = 0; r < rows; ++r) {
    if (!b->errors[static_cast<size_t>(r)].empty()) continue;
    if (dst != r) {
      for (size_t f = 0; f < fields.size(); ++f) {
        if (fields[f].is_string) {
          slot->strings[f][static_cast<size_t>(dst)] = slot->strings[f][static_cast<size_t>(r)];
        } else {
          at::Tensor& t = slot->tensors[f];
          const size_t rb = static_cast<size_t>(t.numel() / t.size(0)) * t.element_size();
          auto* base = static_cast<uint8_t*>(t.data_ptr());
          std::memmove(base + static_cast<size_t>(dst) * rb, base + static_cast<size_t>(r) * rb,
                       rb);
        }
      }
    }
    kept.push_back(b->indices[static_cast<size_t>(r)]);
    ++dst;
  }
  collate_s.add(seconds_since(t0));
  b->skipped = bad;
  for (const auto& e : b->errors) {
    if (!e.empty()) b->last_error = e;
  }
  std::lock_guard<std::mutex> g(mu);
  b->indices = std::move(kept);
  b->valid_rows = dst;
}

}  // namespace torchspeed::data
