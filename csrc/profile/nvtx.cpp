// NVTX mirroring of the ranges (CUDA builds): one "torchspeed" domain, one registered string per
// name, so a push passes a handle instead of the text (Nsight Systems shows them on its timeline).
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "torchspeed/profile/profile.h"

#if defined(TORCHSPEED_WITH_CUDA)
#include <nvtx3/nvToolsExt.h>
#endif

namespace torchspeed::profile {
namespace detail {

bool g_nvtx = false;

#if defined(TORCHSPEED_WITH_CUDA)
namespace {

nvtxDomainHandle_t domain() {
  static const nvtxDomainHandle_t d = nvtxDomainCreateA("torchspeed");
  return d;
}

// Handles for the first kFast ids without a lock; later ids take the lock.
constexpr NameId kFast = 4096;
std::atomic<nvtxStringHandle_t> g_fast[kFast];
std::mutex g_mu;
std::vector<nvtxStringHandle_t> g_slow;

nvtxStringHandle_t handle(NameId id) {
  if (id < kFast) {
    nvtxStringHandle_t h = g_fast[id].load(std::memory_order_acquire);
    if (h != nullptr) return h;
  }
  std::lock_guard<std::mutex> lk(g_mu);
  if (id < kFast) {
    nvtxStringHandle_t h = g_fast[id].load(std::memory_order_relaxed);
    if (h == nullptr) {
      h = nvtxDomainRegisterStringA(domain(), name_of(id).c_str());
      g_fast[id].store(h, std::memory_order_release);
    }
    return h;
  }
  if (g_slow.size() <= id - kFast) g_slow.resize(id - kFast + 1, nullptr);
  nvtxStringHandle_t& h = g_slow[id - kFast];
  if (h == nullptr) h = nvtxDomainRegisterStringA(domain(), name_of(id).c_str());
  return h;
}

}  // namespace

void nvtx_push(NameId name) noexcept {
  nvtxEventAttributes_t a = {};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  try {
    a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    a.message.registered = handle(name);
  } catch (...) {  // keep pushes and pops paired even if the name could not be registered
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = "?";
  }
  nvtxDomainRangePushEx(domain(), &a);
}

void nvtx_pop() noexcept { nvtxDomainRangePop(domain()); }
#else
void nvtx_push(NameId) noexcept {}
void nvtx_pop() noexcept {}
#endif

}  // namespace detail

bool nvtx_available() noexcept {
#if defined(TORCHSPEED_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

void set_nvtx(bool on) {
  if (on && !nvtx_available()) {
    throw std::runtime_error(
        "torchspeed.profile: NVTX ranges need a CUDA build of torchspeed (this one has no CUDA)");
  }
  detail::g_nvtx = on;
}

}  // namespace torchspeed::profile
