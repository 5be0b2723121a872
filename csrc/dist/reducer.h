// The reducer behind torchspeed::dist::AccumulatingDDP (include/torchspeed/dist/ddp.h): flat
// gradient buckets, the post-accumulate-grad hooks that mark readiness, the in-order bucket
// launches, the end-of-backward wait, the join/control collectives and the stats.
#pragma once

#include <torch/csrc/autograd/function.h>

#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "torchspeed/dist/ddp.h"

namespace torchspeed::dist {

class Reducer {
 public:
  Reducer(std::vector<at::Tensor> params, std::vector<at::Tensor> buffers,
          c10::intrusive_ptr<c10d::ProcessGroup> group, DDPOptions options,
          std::vector<std::string> param_names = {}, std::vector<std::string> buffer_names = {});
  ~Reducer();

  bool begin_micro_step(bool allow_sync);
  bool sync_now() const;
  int64_t micro_step() const;
  void zero_grad();
  at::Tensor clip_grad_norm_(double max_norm);
  void join_begin();
  void join();
  double all_reduce_count(double value);
  void broadcast_from_rank0();

  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_; }
  const DDPOptions& options() const { return options_; }
  DDPStats stats() const;
  std::vector<at::Tensor> buckets() const;
  std::vector<at::Tensor> grad_shards() const;
  bool last_nonfinite() const;
  std::string zero_collectives() const;
  std::vector<std::pair<int64_t, int64_t>> param_slots() const;
  std::vector<at::Tensor> slot_params() const;
  const c10::intrusive_ptr<c10d::ProcessGroup>& group() const { return group_; }

 private:
  /// One trainable param: its bucket view and its hook on the param's AccumulateGrad node.
  struct Slot {
    at::Tensor param;
    at::Tensor view;  // the param's gradient inside its bucket, in the param's layout
    int64_t bucket = 0;
    int64_t offset = 0;               // elements into the bucket
    bool ready = false;               // got its gradient in this synchronising micro-step
    bool used = false;                // got a gradient in this accumulation window
    bool grad_was_undefined = false;  // at the end of the window, before the reducer filled it
    c10::intrusive_ptr<torch::autograd::Node> accumulator;  // kept alive: it carries the hook
    uintptr_t hook_key = 0;
  };
  /// One flat buffer of same-dtype, same-device gradients, all-reduced as one collective.
  struct Bucket {
    at::Tensor flat;   // the gradients (params' dtype)
    at::Tensor wire;   // the compressed copy (bf16/fp16) when compression applies, else undefined
    at::Tensor shard;  // zero=1: this rank's reduced shard (params' dtype)
    at::Tensor wire_shard;  // zero=1 with compression: the shard as received
    std::vector<size_t> slots;
    int64_t used = 0;     // elements holding gradients (the rest is zero padding)
    int64_t pending = 0;  // slots not yet ready in this synchronising micro-step
    c10::intrusive_ptr<c10d::Work> work;
    bool launched_during_backward = false;
  };

  /// One small all-reduce: the same params, buffers (count, dtype, shape, requires_grad) and
  /// collective-shaping options on every rank, else a ValueError naming the first difference.
  void verify_same_model_and_options();
  void build_buckets();
  void install_hooks();
  void on_grad_ready(size_t index);
  void end_backward();
  void finish_sync();
  void launch_ready_buckets();
  void launch(size_t bucket);
  void fill_unready_slot(Slot& s);
  void vote_unused();
  /// zero=1: one all-reduce of "some shard held inf/NaN"; when any did, an inf in every rank's
  /// first non-empty shard (so every rank's GradScaler skips the step).
  void agree_on_nonfinite();
  at::Tensor clip_shards(double max_norm);
  void reset_window();
  void recover_interrupted_backward();
  /// Makes `s.param.grad` the bucket view, copying a gradient held elsewhere into it first.
  void adopt_grad(Slot& s);
  /// The presence + payload control all-reduce (join check when inside the join window).
  double control(bool present, double payload);
  void broadcast_buffers();
  void broadcast_all_from_rank0();
  void broadcast_tensors(const std::vector<at::Tensor>& tensors);
  at::Device control_device() const;

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  DDPOptions options_;
  int64_t rank_ = 0;
  int64_t world_ = 1;
  at::ScalarType wire_dtype_ = at::kFloat;  // kFloat = no compression
  std::vector<at::Tensor> all_params_;      // every param (trainable or not), for broadcasts
  std::vector<at::Tensor> buffers_;
  std::vector<std::string> param_names_;   // per all_params_ entry, for error messages
  std::vector<std::string> buffer_names_;  // per buffers_ entry
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;

  mutable std::mutex mu_;
  bool sync_ = false;             // the current micro-step reduces (what sync_now() reports)
  bool armed_ = false;            // the next backward is the synchronising one
  bool backward_active_ = false;  // a backward is running (its end callback is queued)
  bool finishing_ = false;        // inside end_backward of the synchronising micro-step
  bool join_active_ = false;
  bool last_nonfinite_ = false;
  /// zero=1: the shards come from an all-reduce of the whole bucket instead of a reduce-scatter
  /// (Gloo, whose reduce_scatter is several times slower than its ring all-reduce).
  bool zero_by_all_reduce_ = false;
  int backward_task_ = -1;  // the graph task of the running backward
  int64_t completed_ = 0;   // backward passes since the last reduction
  size_t next_launch_ = 0;  // the next bucket to launch, in index order
  int64_t t_first_launch_ = 0;
  int64_t optimizer_steps_ = 0;
  DDPStats stats_;
};

}  // namespace torchspeed::dist
