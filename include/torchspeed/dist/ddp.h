// torchspeed::dist::AccumulatingDDP: data-parallel training with gradient accumulation over
// torch.distributed's c10d process groups (Gloo on CPUs, NCCL on GPUs). Gradients live in flat
// bucket buffers from construction (each param's grad is a view into its bucket), so k micro-steps
// accumulate in place with zero communication; on the k-th micro-step each bucket's asynchronous
// all-reduce starts as soon as its last gradient is ready, in reverse parameter order identical on
// every rank, and the last wait happens before backward() returns.
//
//   auto store = c10::make_intrusive<c10d::TCPStore>(master_addr, store_opts);
//   auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, gloo_opts);
//   torchspeed::dist::AccumulatingDDP ddp(*model, group,
//                                         torchspeed::dist::DDPOptions().accumulation_steps(8));
//   for (auto& batch : loader) {
//     ddp.begin_micro_step();                       // before the forward
//     auto loss = loss_fn(model->forward(batch.x), batch.y) / 8;
//     loss.backward();                              // all-reduces only on the 8th micro-step
//     if (ddp.sync_now()) { opt.step(); opt.zero_grad(); }
//   }
//
// Python: torchspeed.dist.AccumulatingDDP (python/torchspeed/dist), built on this class.
#pragma once

#include <torch/arg.h>
#include <torch/nn/module.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "torchspeed/export.h"

namespace torchspeed::dist {

/// The wrapper's knobs; the names and defaults follow torch.nn.parallel.DistributedDataParallel.
struct TORCHSPEED_API DDPOptions {
  /// Micro-steps per optimizer step: backward() reduces on every k-th micro-step only.
  TORCH_ARG(int64_t, accumulation_steps) = 1;
  /// Bucket size in MiB, and the (smaller) first bucket's, so the first all-reduce starts early.
  TORCH_ARG(double, bucket_cap_mb) = 25.0;
  TORCH_ARG(double, first_bucket_cap_mb) = 1.0;
  /// "none", "bf16" or "fp16": float32 buckets travel in that dtype (half the bytes); the division
  /// by the world size and the cast are one pass, and the sum is widened back after the reduction.
  TORCH_ARG(std::string, compression) = "none";
  /// Agree across ranks which params got no gradient in the whole window (one small extra
  /// all-reduce) and leave their .grad undefined, as single-process training would. Off: such a
  /// param's gradient is reduced as zeros and its .grad is a defined tensor.
  TORCH_ARG(bool, find_unused_parameters) = false;
  /// Broadcast the module's buffers from rank 0 before the forward of every synchronising
  /// micro-step (and at construction), as torch's DDP does before every forward.
  TORCH_ARG(bool, broadcast_buffers) = true;
  /// ZeRO stage: 0 all-reduces every bucket; 1 reduce-scatters it instead (buckets padded to a
  /// multiple of the world size), so each rank receives the averaged gradient of its contiguous
  /// shard of every bucket (grad_shards()) and steps only that shard (ZeroOptimizer,
  /// torchspeed/dist/zero.h; Python: torchspeed.dist.ZeroOptimizer). At the end of the
  /// synchronising backward one small all-reduce tells every rank whether any shard held inf/NaN;
  /// if so, every rank's first shard element that belongs to a param gets an inf, so a GradScaler
  /// skips the step everywhere.
  TORCH_ARG(int64_t, zero) = 0;
};

/// What the reducer did, for the profiler and for tests. Times are on torchspeed's one clock
/// (profile::now_ns). "last_*" describe the most recent synchronising micro-step.
struct DDPStats {
  int64_t world_size = 1;
  int64_t buckets = 0;              // gradient buckets (one all-reduce each per sync)
  int64_t bucket_bytes = 0;         // bytes of all gradient buckets, in the params' dtypes
  int64_t micro_steps = 0;          // backward passes seen
  int64_t sync_steps = 0;           // synchronising micro-steps (= optimizer steps)
  int64_t bucket_collectives = 0;   // gradient all-reduces issued, in total
  int64_t control_collectives = 0;  // broadcasts, join checks, counts, unused-param votes
  int64_t bytes_reduced = 0;        // bytes all-reduced for gradients, in the wire dtype
  int64_t comm_ns = 0;              // sum over syncs of first launch -> last wait returned
  int64_t exposed_ns = 0;           // sum over syncs of the wait after backward's own work
  int64_t last_bucket_collectives = 0;
  int64_t last_bytes_reduced = 0;
  int64_t last_comm_ns = 0;
  int64_t last_exposed_ns = 0;
  /// 1 - exposed / comm of the last sync: the fraction of its communication hidden by backward.
  double last_overlap = 0.0;
  /// Buckets of the last sync that were launched during backward (the rest launched at its end).
  int64_t last_buckets_overlapped = 0;
  /// ZeRO-1: bytes of this rank's gradient shards, and synchronising steps whose gradients held
  /// inf/NaN on some rank (every rank counts the same).
  int64_t grad_shard_bytes = 0;
  int64_t nonfinite_steps = 0;
};

/// Thrown on every rank still training when another rank has left the training loop inside
/// join(): names the ranks that ran out and the optimizer step. (Python: RanksOutOfData.)
class TORCHSPEED_API RanksOutOfData : public std::runtime_error {
 public:
  RanksOutOfData(const std::string& what, std::vector<int64_t> ranks)
      : std::runtime_error(what), ranks_(std::move(ranks)) {}
  const std::vector<int64_t>& ranks() const { return ranks_; }

 private:
  std::vector<int64_t> ranks_;
};

// ---- process groups for C++ apps
// -----------------------------------------------------------------

/// torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT. Throws a clear
/// error naming the variable when one is missing or malformed (run under torchrun, or set them).
struct TorchrunEnv {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;
  std::string master_addr;
  int64_t master_port = 0;
  /// TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent already serves the TCPStore on
  /// MASTER_PORT, so every rank connects as a client (rank 0 must not try to serve it too).
  bool agent_store = false;
  /// Whether this rank should create the TCPStore as its server.
  bool store_server() const { return rank == 0 && !agent_store; }
};
TORCHSPEED_API TorchrunEnv torchrun_env();

/// A c10d ProcessGroup with a Gloo backend (CPU tensors) over `store`, as
/// torch.distributed.init_process_group("gloo") makes one. The Gloo device is the default one
/// for this host, or the interface named by GLOO_SOCKET_IFNAME. (torch's ProcessGroupGloo.hpp
/// needs Gloo's own headers, which the torch wheel does not ship: libtorchspeed was built with
/// them, so an app calling this needs none. Throws when this build had no Gloo headers; see
/// build_info.json's "gloo-cpp" feature.)
TORCHSPEED_API c10::intrusive_ptr<c10d::ProcessGroup> new_gloo_group(
    c10::intrusive_ptr<c10d::Store> store, int64_t rank, int64_t world_size,
    std::chrono::milliseconds timeout = std::chrono::minutes(10));

/// torchrun's environment -> a TCPStore on MASTER_ADDR:MASTER_PORT (rank 0 serves it) -> a
/// process group: "gloo" (CPU), or "nccl" (CUDA builds of torch with NCCL; the current device
/// should be cuda:LOCAL_RANK).
TORCHSPEED_API c10::intrusive_ptr<c10d::ProcessGroup> init_process_group_from_env(
    const std::string& backend = "gloo",
    std::chrono::milliseconds timeout = std::chrono::minutes(10));

class Reducer;

/// Gradient-accumulating data parallelism over a c10d process group. Construction broadcasts
/// params and buffers from rank 0 and makes each trainable param's .grad a view into its bucket.
/// The object must outlive the backward passes it serves; its destructor removes its hooks (the
/// grads stay valid tensors, owned by their buckets).
class TORCHSPEED_API AccumulatingDDP {
 public:
  /// Construction first checks, in one small all-reduce, that every rank passed the same params
  /// and buffers (count, dtype, shape, requires_grad) and the same options (accumulation_steps,
  /// bucket caps, compression, find_unused_parameters, broadcast_buffers); when they differ every
  /// rank throws a c10::ValueError naming the first difference (param_names and buffer_names,
  /// when given, name the tensors). A param frozen after construction (requires_grad false) with
  /// no gradient keeps an undefined .grad through the reduction, as in a single process.
  AccumulatingDDP(std::vector<at::Tensor> params, std::vector<at::Tensor> buffers,
                  c10::intrusive_ptr<c10d::ProcessGroup> group, DDPOptions options = {},
                  std::vector<std::string> param_names = {},
                  std::vector<std::string> buffer_names = {});
  /// The module's parameters (requires_grad ones are bucketed) and buffers, named for errors.
  AccumulatingDDP(const torch::nn::Module& module, c10::intrusive_ptr<c10d::ProcessGroup> group,
                  DDPOptions options = {});
  ~AccumulatingDDP();
  AccumulatingDDP(const AccumulatingDDP&) = delete;
  AccumulatingDDP& operator=(const AccumulatingDDP&) = delete;

  /// Call before each micro-step's forward. Returns whether this micro-step's backward reduces:
  /// true for the accumulation_steps-th backward since the last reduction, unless allow_sync is
  /// false (torch's no_sync()). On a synchronising micro-step it first runs the join check (inside
  /// join(), see below) and broadcasts the buffers (broadcast_buffers).
  bool begin_micro_step(bool allow_sync = true);
  /// Whether the current micro-step (the last begin_micro_step) reduces; stays true after its
  /// backward until the next begin_micro_step, so `if (ddp.sync_now()) opt.step();` follows it.
  bool sync_now() const;
  /// Backward passes since the last reduction (0 .. accumulation_steps - 1).
  int64_t micro_step() const;

  /// Zeroes every bucket in place and points each param's .grad at its view again (cheaper than
  /// optimizer.zero_grad(set_to_none=true), after which the next backward copies into the bucket).
  void zero_grad();
  /// Global-norm clipping of the reduced gradients: one read of each bucket for the norm, one
  /// in-place scale when it exceeds max_norm (norm_type 2). Returns the total norm (0-dim float32
  /// tensor on the buckets' device); identical on every rank. max_norm >= 0 (c10::ValueError
  /// otherwise); as torch.nn.utils.clip_grad_norm_, 0 zeroes the gradients and inf leaves them.
  /// With zero=1 it clips the shards: partial sums of squares (float64), one small all-reduce.
  at::Tensor clip_grad_norm_(double max_norm);

  /// Uneven inputs: call join_begin() before the training loop and join() when this rank has run
  /// out of data. Inside the join window every synchronising micro-step first all-reduces a small
  /// presence vector; when a rank is missing, the others throw RanksOutOfData naming it (at the
  /// same optimizer step on every rank) instead of waiting for its collectives forever. join()
  /// returns once every rank has either joined or seen that some rank joined.
  void join_begin();
  void join();
  /// One control all-reduce of `value` over all ranks (float64), with the join check when inside
  /// join_begin(). Serves the loss normalisation: the token count of a window, summed everywhere.
  double all_reduce_count(double value);

  /// Re-broadcasts params and buffers from rank 0 (construction does it once).
  void broadcast_from_rank0();

  int64_t rank() const;
  int64_t world_size() const;
  const DDPOptions& options() const;
  DDPStats stats() const;
  /// The flat gradient buckets, in reduction order, and each trainable param's (bucket, offset).
  std::vector<at::Tensor> buckets() const;
  /// zero=1: this rank's shard of every bucket's reduced gradient (elements [rank * s,
  /// (rank + 1) * s) of the padded bucket), valid after a synchronising backward; else empty.
  std::vector<at::Tensor> grad_shards() const;
  /// zero=1: whether the last synchronising backward found inf/NaN in any rank's shard.
  bool last_nonfinite() const;
  /// zero=1: "reduce_scatter" (the shards reduce-scattered, the params all-gathered: NCCL), or
  /// "all_reduce" (the shards cut from an all-reduce, the params gathered by one broadcast per
  /// rank: Gloo, whose ring all-reduce and broadcast are much faster than its
  /// reduce_scatter/all_gather; TORCHSPEED_ZERO_COLLECTIVES=native|all_reduce overrides);
  /// "" without zero.
  std::string zero_collectives() const;
  std::vector<std::pair<int64_t, int64_t>> param_slots() const;
  /// The trainable params in slot order (param_slots()[i] is where slot_params()[i] lies).
  std::vector<at::Tensor> slot_params() const;
  const c10::intrusive_ptr<c10d::ProcessGroup>& process_group() const;

 private:
  std::unique_ptr<Reducer> reducer_;
};

}  // namespace torchspeed::dist
