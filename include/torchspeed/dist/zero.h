// torchspeed::dist::ZeroOptimizer: ZeRO-1 for a C++ AccumulatingDDP built with
// DDPOptions().zero(1): each rank keeps optimizer state only for its contiguous shard of every
// gradient bucket, steps it with any torch::optim optimizer (torchspeed's fused AdamW, Adam, SGD,
// Lion or torch's own) and all-gathers the updated params bucket by bucket (bucket b's gather runs
// while b + 1 is stepped).
//
//   torchspeed::dist::AccumulatingDDP ddp(*model, group,
//   DDPOptions().accumulation_steps(8).zero(1)); auto opt =
//   torchspeed::dist::ZeroOptimizer::make<torchspeed::optim::AdamW>(
//       ddp, torchspeed::optim::AdamWOptions(1e-3).weight_decay(0.1));
//   ... ddp.begin_micro_step(); loss.backward();
//   if (ddp.sync_now()) { ddp.clip_grad_norm_(1.0); opt.step(); opt.zero_grad(); }
//
// The shard of bucket b on this rank is cut into "pieces", one per param it overlaps: each piece is
// a 1-D leaf tensor (a view into the bucket's shard buffer, so the gather reads it in place) whose
// .grad is the matching slice of the reduced gradient shard. The optimizer sees one param per
// piece, so per-param semantics are those of a single process: a param whose .grad is undefined in
// a step (frozen, or unused on every rank with find_unused_parameters) gets no state and no update,
// and its step count does not advance. Python: torchspeed.dist.ZeroOptimizer drives the same
// ZeroShards with a Python optimizer per bucket.
//
// Checkpoints share Python's v2 layout and file format:
//   auto bytes = torch::pickle_save(opt.state_dict());          // this rank's shard (torch.save's)
//   opt.load_state_dict({torch::pickle_load(bytes)});           // the same world size, or
//   opt.load_state_dict(every_ranks_dicts);                     // any world size, re-sharded
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "torchspeed/dist/ddp.h"
#include "torchspeed/export.h"

namespace torchspeed::dist {

/// One param's slice in this rank's shard of one bucket.
struct ZeroPiece {
  int64_t bucket = 0;
  int64_t slot = 0;          // index into AccumulatingDDP::slot_params()
  int64_t shard_offset = 0;  // elements into this rank's shard of the bucket
  int64_t param_offset = 0;  // elements into the param, in its memory order
  int64_t numel = 0;
};

/// What the sharded steps did (added to the Python stats).
struct ZeroStats {
  int64_t zero_steps = 0;
  int64_t zero_skipped_steps = 0;
  int64_t bytes_all_gathered = 0;
  int64_t last_bytes_all_gathered = 0;
  int64_t shard_param_bytes = 0;  // this rank's shard buffers (the pieces' values)
};

/// The shard layout and the step's collectives, without an optimizer: begin_step() (skip check,
/// unscale, piece grads, piece values from the params), then per bucket the optimizer's step on
/// pieces(b) and launch_gather(b), then finish_step() (waits, writes the params back).
class TORCHSPEED_API ZeroShards {
 public:
  /// ddp must be built with zero=1 and outlive this object.
  explicit ZeroShards(AccumulatingDDP& ddp);
  ~ZeroShards();
  ZeroShards(const ZeroShards&) = delete;
  ZeroShards& operator=(const ZeroShards&) = delete;

  int64_t num_buckets() const { return static_cast<int64_t>(shards_.size()); }
  /// The pieces of bucket b on this rank (leaf tensors requiring grad; maybe none).
  const std::vector<at::Tensor>& pieces(int64_t bucket) const;
  const std::vector<ZeroPiece>& layout(int64_t bucket) const;
  /// Elements of this rank's shard of bucket b (padded bucket numel / world).
  int64_t shard_numel(int64_t bucket) const;
  /// On a rank that owns no param element of any bucket (its shards are padding only: more ranks
  /// than elements per bucket): a 1-element view of its first shard's padding gradient, inf after
  /// a synchronising backward that found inf/NaN on some rank, else 0. Hand it to a GradScaler as
  /// a gradient, so its found_inf and scale follow every other rank's (whose pieces' gradients
  /// carry the inf). Undefined on every other rank.
  const at::Tensor& nonfinite_flag() const { return nonfinite_flag_; }

  /// Starts a step. Returns false (and changes nothing) when the step must be skipped: the last
  /// synchronising backward found inf/NaN on some rank, or found_inf (GradScaler's) is nonzero.
  /// Otherwise divides the gradient shards by grad_scale (when defined), gives each piece its
  /// gradient slice (undefined for a param whose .grad is undefined or that no longer requires
  /// grad) and its values from the params (the params are the truth: a checkpoint loaded into the
  /// module is picked up).
  bool begin_step(const at::Tensor& grad_scale = {}, const at::Tensor& found_inf = {});
  /// Starts the asynchronous all-gather of bucket b's shard (call after stepping its pieces).
  void launch_gather(int64_t bucket);
  /// Waits for the gathers and writes the updated values into the params that had a gradient;
  /// every piece's .grad is its gradient slice again (what GradScaler.unscale_ and clipping see).
  void finish_step();

  ZeroStats stats() const { return stats_; }
  /// "all_reduce" or "reduce_scatter", as AccumulatingDDP::zero_collectives().
  const std::string& collectives() const { return collectives_; }
  /// How the params are gathered: "broadcast" (Gloo: each rank broadcasts its shard, half the
  /// bytes of an all-reduce and at Gloo's broadcast speed, unlike its slow all_gather) or
  /// "all_gather" (the real collective: NCCL, or TORCHSPEED_ZERO_COLLECTIVES=native).
  std::string gather_method() const { return gather_by_broadcast_ ? "broadcast" : "all_gather"; }

 private:
  void restore_grads();

  AccumulatingDDP& ddp_;
  std::vector<at::Tensor> params_;       // the trainable params, slot order
  std::vector<at::Tensor> flat_params_;  // each param in memory order, or undefined (not dense)
  std::vector<at::Tensor> grad_shards_;
  std::vector<at::Tensor> shards_;    // per bucket: this rank's shard (the pieces are views)
  std::vector<at::Tensor> gathered_;  // per bucket: the full padded bucket after the gather
  at::Tensor nonfinite_flag_;         // see nonfinite_flag()
  std::vector<std::vector<at::Tensor>> pieces_;
  std::vector<std::vector<at::Tensor>> piece_grads_;
  std::vector<std::vector<ZeroPiece>> layout_;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> bucket_slots_;  // (slot, offset) per bucket
  std::vector<std::vector<c10::intrusive_ptr<c10d::Work>>> works_;      // per bucket
  std::vector<bool> stepped_;  // per slot: had a gradient in the running step
  // Per slot: the param's version counter when its pieces last equalled it (after a load or a
  // store); unchanged at the next step means nothing wrote the param, and the load is skipped.
  std::vector<int64_t> synced_version_;
  std::string collectives_;
  bool gather_by_broadcast_ = false;
  bool in_step_ = false;
  ZeroStats stats_;
};

/// ZeRO-1 over a C++ optimizer: one optimizer per bucket, made by `make_optimizer` from that
/// bucket's pieces (buckets without pieces on this rank get none).
class TORCHSPEED_API ZeroOptimizer {
 public:
  using Factory =
      std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor> pieces)>;
  /// Collective: every rank builds it (one small all-reduce agrees on whether the optimizers are
  /// torchspeed::optim::LAMB, whose per-param trust ratio takes a two-phase step around an
  /// all-reduce of the pieces' norms; every bucket's optimizer must then be LAMB).
  ZeroOptimizer(AccumulatingDDP& ddp, Factory make_optimizer);

  /// An Opt(pieces, options) per bucket, e.g. make<torchspeed::optim::AdamW>(ddp, AdamWOptions()).
  template <class Opt, class Options>
  static ZeroOptimizer make(AccumulatingDDP& ddp, Options options) {
    return ZeroOptimizer(ddp, [options](std::vector<at::Tensor> pieces) {
      return std::unique_ptr<torch::optim::Optimizer>(new Opt(std::move(pieces), options));
    });
  }

  /// One sharded step: skipped on every rank (returns false) when any rank's reduced gradient
  /// held inf/NaN or found_inf is nonzero; grads are divided by grad_scale when it is defined
  /// (torch.amp.GradScaler's two tensors, as torchspeed::optim::GradScaling carries them).
  bool step(const at::Tensor& grad_scale = {}, const at::Tensor& found_inf = {});
  /// The module's gradients (AccumulatingDDP::zero_grad: the buckets, zeroed in place).
  void zero_grad();

  /// This rank's shard, laid out as Python's torchspeed.dist.ZeroOptimizer.state_dict() (format
  /// "torchspeed.dist.zero1/v2", a dict of str): world_size, rank, optimizer_class, layout (per
  /// bucket its padded size, dtype, its params as [slot, offset, numel] and this rank's pieces as
  /// [slot, offset into the param, numel]), param_shapes, and shards (per bucket {"state": piece
  /// index -> {name -> value}, "param_groups": [its options and "params"]}, the optimizer's own
  /// state and options, by name). torch::pickle_save writes it (torch.load reads the file in
  /// Python, and torchspeed.dist.consolidate_state_dict takes every rank's).
  c10::IValue state_dict() const;
  /// This rank's own state dict (same world size and rank), or every rank's state dicts in rank
  /// order from a run on any world size: each param's elementwise state is put together from the
  /// old pieces and cut for this rank's; scalars (a step count) are copied. Everything is checked
  /// and built before any optimizer changes, and an optimizer that refuses its part gets its old
  /// state back: a bad state raises and nothing is loaded. The params come from the model's own
  /// checkpoint (the next step reads them).
  void load_state_dict(const std::vector<c10::IValue>& state_dicts);

  /// The optimizer of bucket b, or nullptr when this rank has no piece of it.
  torch::optim::Optimizer* optimizer(int64_t bucket) const;
  ZeroShards& shards() { return *shards_; }
  const ZeroShards& shards() const { return *shards_; }

 private:
  void lamb_step();

  AccumulatingDDP* ddp_;
  std::shared_ptr<ZeroShards> shards_;
  std::vector<std::shared_ptr<torch::optim::Optimizer>> optimizers_;
  bool lamb_ = false;  // torchspeed::optim::LAMB: a two-phase step around the norms' all-reduce
};

}  // namespace torchspeed::dist
