// Process groups for C++ apps (include/torchspeed/dist/ddp.h): torchrun's environment, a Gloo
// group over any c10d store, and a TCPStore-rendezvous group from the environment, made the way
// torch.distributed.init_process_group makes them in Python.
#include <cstdlib>
#include <string>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "torchspeed/dist/ddp.h"

// ProcessGroupGloo.hpp includes Gloo's headers (not in the torch wheel; Debian: libgloo-dev).
// Every Gloo object in torch's classes sits behind a pointer, so the declarations suffice.
#if defined(USE_C10D_GLOO) && __has_include(<gloo/context.h>)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#define TORCHSPEED_HAVE_GLOO_HEADERS 1
#endif
#if defined(USE_C10D_NCCL) && __has_include(<nccl.h>)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define TORCHSPEED_HAVE_NCCL_HEADERS 1
#endif

namespace torchspeed::dist {
namespace {

constexpr const char* kName = "torchspeed.dist";

int64_t env_int(const char* name, int64_t fallback, bool required, int64_t lo, int64_t hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    TORCH_CHECK(!required, kName, ": environment variable ", name,
                " is not set (run under torchrun, which sets RANK, WORLD_SIZE, LOCAL_RANK, "
                "MASTER_ADDR and MASTER_PORT, or set them yourself)");
    return fallback;
  }
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  TORCH_CHECK(end && *end == '\0' && x >= lo && x <= hi, kName, ": environment variable ", name,
              " must be an integer in [", lo, ", ", hi, "], got '", v, "'");
  return x;
}

/// A ProcessGroup whose only backend is `backend` for `device` (what init_process_group builds).
[[maybe_unused]] c10::intrusive_ptr<c10d::ProcessGroup> as_process_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    c10d::ProcessGroup::BackendType type, c10::DeviceType device,
    c10::intrusive_ptr<c10d::Backend> backend) {
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  group->setDefaultBackend(type);
  group->setBackend(device, type, backend);
  return group;
}

}  // namespace

TorchrunEnv torchrun_env() {
  TorchrunEnv e;
  e.world_size = env_int("WORLD_SIZE", 1, true, 1, 1 << 20);
  e.rank = env_int("RANK", 0, true, 0, e.world_size - 1);
  e.local_rank = env_int("LOCAL_RANK", 0, false, 0, 1 << 20);
  const char* addr = std::getenv("MASTER_ADDR");
  TORCH_CHECK(addr && *addr, kName,
              ": environment variable MASTER_ADDR is not set (run under torchrun, or set it)");
  e.master_addr = addr;
  e.master_port = env_int("MASTER_PORT", 0, true, 1, 65535);
  const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  e.agent_store = agent && (std::string(agent) == "True" || std::string(agent) == "1");
  return e;
}

c10::intrusive_ptr<c10d::ProcessGroup> new_gloo_group(c10::intrusive_ptr<c10d::Store> store,
                                                      int64_t rank, int64_t world_size,
                                                      std::chrono::milliseconds timeout) {
  TORCH_CHECK(store, kName, ".new_gloo_group: store must be a c10d Store, got null");
  TORCH_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, kName,
              ".new_gloo_group: rank must be in [0, world_size), got rank ", rank, " of ",
              world_size);
#if defined(TORCHSPEED_HAVE_GLOO_HEADERS)
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname && *ifname) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  } else {
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  const int r = static_cast<int>(rank), n = static_cast<int>(world_size);
  return as_process_group(store, r, n, c10d::ProcessGroup::BackendType::GLOO, c10::DeviceType::CPU,
                          c10::make_intrusive<c10d::ProcessGroupGloo>(store, r, n, options));
#else
  TORCH_CHECK(false, kName,
              ".new_gloo_group: this torchspeed was built without Gloo's headers (feature "
              "gloo-cpp); rebuild with them installed (Debian: apt-get install libgloo-dev), or "
              "create the group in Python and pass it to torchspeed.dist.AccumulatingDDP");
#endif
}

c10::intrusive_ptr<c10d::ProcessGroup> init_process_group_from_env(
    const std::string& backend, std::chrono::milliseconds timeout) {
  const TorchrunEnv env = torchrun_env();
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(env.master_port);
  opts.isServer = env.store_server();
  opts.numWorkers = static_cast<size_t>(env.world_size);
  opts.timeout = timeout;
  auto store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
  if (backend == "gloo") return new_gloo_group(store, env.rank, env.world_size, timeout);
  if (backend == "nccl") {
#if defined(TORCHSPEED_HAVE_NCCL_HEADERS)
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    const int r = static_cast<int>(env.rank), n = static_cast<int>(env.world_size);
    return as_process_group(store, r, n, c10d::ProcessGroup::BackendType::NCCL,
                            c10::DeviceType::CUDA,
                            c10::make_intrusive<c10d::ProcessGroupNCCL>(store, r, n, options));
#else
    TORCH_CHECK(false, kName,
                ".init_process_group_from_env: 'nccl' needs a CUDA build of torch with NCCL "
                "(and NCCL's headers at torchspeed's build)");
#endif
  }
  TORCH_CHECK(false, kName, ".init_process_group_from_env: backend must be 'gloo' or 'nccl', got '",
              backend, "'");
}

}  // namespace torchspeed::dist
