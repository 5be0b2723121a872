// The copy of a delivered batch to the loader's device on a side stream: the consumer's
// current stream waits for it on the GPU only, and the slot's host memory is reused only after it.
#include <c10/core/DeviceGuard.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <map>
#include <string>

#include "data/loader_impl.h"

namespace torchspeed::data {

// Copies on a side stream; the caller's current stream waits for the copy on the GPU only.
void Loader::Impl::copy_to_device(Batch* out, Slot* slot) {
  const auto t0 = Clock::now();
  const c10::impl::VirtualGuardImpl impl(device->type());
  const c10::Stream current = impl.getStream(*device);
  const c10::Stream side = impl.getStreamFromGlobalPool(*device);
  std::map<std::string, at::Tensor> moved;
  {
    c10::StreamGuard guard(side);
    for (auto& [name, t] : out->tensors) {
      at::Tensor dst = at::empty(t.sizes(), t.options().device(*device).pinned_memory(false));
      dst.copy_(t, /*non_blocking=*/pin);
      moved[name] = dst;
    }
  }
  c10::Event done(device->type());
  done.record(side);
  done.block(current);
  // Allocated on `side`, used on `current`: tell the caching allocator.
  for (auto& [name, t] : moved) t.record_stream(current);
  slot->copy_done = std::move(done);  // the slot's host memory is reused only after the copy
  out->tensors = std::move(moved);
  copy_s.add(seconds_since(t0));
}

}  // namespace torchspeed::data
