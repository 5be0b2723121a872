// ZeRO-1's shard layout and step collectives (ZeroShards) and the C++ ZeroOptimizer over them
// (include/torchspeed/dist/zero.h). Python's torchspeed.dist.ZeroOptimizer drives ZeroShards too.
#include "torchspeed/dist/zero.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "torchspeed/profile/profile.h"

namespace torchspeed::dist {
namespace {

constexpr const char* kName = "torchspeed.dist.ZeroOptimizer";

// A dense param as one flat view in its memory order (how its gradient lies in the bucket,
// channels_last included); undefined when its layout has gaps (the bucket then holds it in logical
// order, as the reducer does).
at::Tensor flat_view(const at::Tensor& p) {
  if (!p.is_non_overlapping_and_dense()) return {};
  return p.detach().as_strided({p.numel()}, {1}, p.storage_offset());
}

}  // namespace

ZeroShards::ZeroShards(AccumulatingDDP& ddp) : ddp_(ddp) {
  TORCH_CHECK_VALUE(
      ddp.options().zero() == 1, kName,
      ": the AccumulatingDDP must be built with zero=1, got zero=", ddp.options().zero());
  params_ = ddp.slot_params();
  grad_shards_ = ddp.grad_shards();
  collectives_ = ddp.zero_collectives();
  gather_by_broadcast_ = collectives_ == "all_reduce";
  const std::vector<at::Tensor> buckets = ddp.buckets();
  const auto slots = ddp.param_slots();
  const int64_t world = ddp.world_size(), rank = ddp.rank();
  const size_t nb = buckets.size();
  bucket_slots_.resize(nb);
  for (size_t i = 0; i < slots.size(); ++i) {
    bucket_slots_[slots[i].first].emplace_back(static_cast<int64_t>(i), slots[i].second);
  }
  shards_.resize(nb);
  gathered_.resize(nb);
  pieces_.resize(nb);
  piece_grads_.resize(nb);
  layout_.resize(nb);
  works_.resize(nb);
  stepped_.assign(params_.size(), false);
  synced_version_.assign(params_.size(), -1);
  at::NoGradGuard no_grad;
  for (size_t b = 0; b < nb; ++b) {
    auto& in_bucket = bucket_slots_[b];
    std::sort(in_bucket.begin(), in_bucket.end(),
              [](const auto& x, const auto& y) { return x.second < y.second; });
    const int64_t s = buckets[b].numel() / world, lo = rank * s;
    shards_[b] = at::zeros({s}, buckets[b].options());
    gathered_[b] = at::empty_like(buckets[b]);
    stats_.shard_param_bytes += shards_[b].nbytes();
    for (const auto& [slot, offset] : in_bucket) {
      const int64_t numel = params_[slot].numel();
      const int64_t a = std::max(lo, offset), z = std::min(lo + s, offset + numel);
      if (a >= z) continue;
      ZeroPiece piece{static_cast<int64_t>(b), slot, a - lo, a - offset, z - a};
      // A leaf sharing the shard's memory: the optimizer updates it in place, the gather reads
      // the shard as it is.
      at::Tensor value = shards_[b].narrow(0, piece.shard_offset, piece.numel).detach();
      value.set_requires_grad(true);
      at::Tensor grad = grad_shards_[b].narrow(0, piece.shard_offset, piece.numel);
      value.mutable_grad() = grad;
      pieces_[b].push_back(value);
      piece_grads_[b].push_back(grad);
      layout_[b].push_back(piece);
    }
  }
  // A rank with padding only: the reducer marks element 0 of its first non-empty shard (see
  // Reducer::agree_on_nonfinite).
  const bool owns_nothing = std::all_of(layout_.begin(), layout_.end(),
                                        [](const auto& pieces) { return pieces.empty(); });
  for (size_t b = 0; b < nb && owns_nothing; ++b) {
    if (grad_shards_[b].numel() == 0) continue;
    nonfinite_flag_ = grad_shards_[b].narrow(0, 0, 1);
    break;
  }
}

ZeroShards::~ZeroShards() {
  for (auto& bucket : works_) {
    for (auto& w : bucket) {
      try {
        w->wait();
      } catch (...) {  // a destructor must not throw; the step that launched it saw the error
      }
    }
  }
}

const std::vector<at::Tensor>& ZeroShards::pieces(int64_t bucket) const {
  TORCH_CHECK_INDEX(bucket >= 0 && bucket < num_buckets(), kName, ": bucket must be in [0, ",
                    num_buckets(), "), got ", bucket);
  return pieces_[bucket];
}

const std::vector<ZeroPiece>& ZeroShards::layout(int64_t bucket) const {
  TORCH_CHECK_INDEX(bucket >= 0 && bucket < num_buckets(), kName, ": bucket must be in [0, ",
                    num_buckets(), "), got ", bucket);
  return layout_[bucket];
}

int64_t ZeroShards::shard_numel(int64_t bucket) const {
  TORCH_CHECK_INDEX(bucket >= 0 && bucket < num_buckets(), kName, ": bucket must be in [0, ",
                    num_buckets(), "), got ", bucket);
  return shards_[bucket].numel();
}

void ZeroShards::restore_grads() {
  for (size_t b = 0; b < pieces_.size(); ++b) {
    for (size_t k = 0; k < pieces_[b].size(); ++k) {
      pieces_[b][k].mutable_grad() = piece_grads_[b][k];
    }
  }
}

bool ZeroShards::begin_step(const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  if (in_step_) {  // an earlier step raised half-way (an optimizer error): drain what it launched
    for (auto& bucket : works_) {
      for (auto& w : bucket) {
        try {
          w->wait();
        } catch (...) {
        }
      }
      bucket.clear();
    }
    restore_grads();
    synced_version_.assign(params_.size(), -1);  // the pieces may be half-stepped: reload
    in_step_ = false;
  }
  stats_.last_bytes_all_gathered = 0;
  bool skip = ddp_.last_nonfinite();
  if (found_inf.defined() && found_inf.numel() > 0) {
    skip = skip || found_inf.to(at::kCPU, at::kDouble).ne(0).any().item<bool>();
  }
  if (skip) {  // every rank skips: the reducer made every rank see the non-finite gradient
    ++stats_.zero_skipped_steps;
    return false;
  }
  at::NoGradGuard no_grad;
  if (grad_scale.defined()) {
    for (at::Tensor& g : grad_shards_) g.mul_(at::reciprocal(grad_scale.to(g.scalar_type())));
  }
  // A param without a gradient (frozen, or unused on every rank with find_unused_parameters):
  // no gradient for its pieces, so the optimizer neither updates it nor advances its state, as a
  // single-process optimizer leaves a param whose .grad is None. Every rank sees the same.
  for (size_t i = 0; i < params_.size(); ++i) {
    stepped_[i] = params_[i].requires_grad() && params_[i].grad().defined();
  }
  // The pieces' values from the params, unless a param was not written since its pieces last
  // equalled it (the usual case: only this object writes the params between steps).
  std::vector<bool> load(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    load[i] = static_cast<int64_t>(params_[i]._version()) != synced_version_[i];
  }
  for (size_t b = 0; b < pieces_.size(); ++b) {
    for (size_t k = 0; k < pieces_[b].size(); ++k) {
      const ZeroPiece& piece = layout_[b][k];
      const at::Tensor& p = params_[piece.slot];
      if (!stepped_[piece.slot]) pieces_[b][k].mutable_grad() = at::Tensor();
      if (!load[piece.slot]) continue;
      at::Tensor flat = flat_view(p);
      if (!flat.defined()) flat = p.detach().reshape({-1});
      pieces_[b][k].detach().copy_(flat.narrow(0, piece.param_offset, piece.numel));
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    synced_version_[i] = static_cast<int64_t>(params_[i]._version());
  }
  in_step_ = true;
  return true;
}

void ZeroShards::launch_gather(int64_t bucket) {
  TORCH_CHECK(in_step_, kName, ": launch_gather outside a step (call begin_step first)");
  TORCH_CHECK_INDEX(bucket >= 0 && bucket < num_buckets(), kName, ": bucket must be in [0, ",
                    num_buckets(), "), got ", bucket);
  TORCHSPEED_PHASE("torchspeed.dist.zero_gather", profile::Phase::Comm);
  const auto& group = ddp_.process_group();
  at::Tensor& shard = shards_[bucket];
  at::Tensor& full = gathered_[bucket];
  TORCH_CHECK(works_[bucket].empty(), kName, ": bucket ", bucket, " is already being gathered");
  if (gather_by_broadcast_) {
    // Gloo, whose all_gather is ~4x slower than its ring all-reduce: each rank broadcasts its
    // shard into its slice of the full bucket (every rank sends and receives (w-1)/w of the
    // bucket once, half of what an all-reduce of zeros plus the shard would move).
    const int64_t s = shard.numel(), world = ddp_.world_size();
    full.narrow(0, ddp_.rank() * s, s).copy_(shard);
    for (int64_t r = 0; r < world; ++r) {
      std::vector<at::Tensor> tensors{full.narrow(0, r * s, s)};
      c10d::BroadcastOptions opts;
      opts.rootRank = r;
      works_[bucket].push_back(group->broadcast(tensors, opts));
    }
  } else {
    works_[bucket].push_back(group->all_gather_single(full, shard));
  }
  stats_.bytes_all_gathered += full.nbytes();
  stats_.last_bytes_all_gathered += full.nbytes();
}

void ZeroShards::finish_step() {
  TORCH_CHECK(in_step_, kName, ": finish_step outside a step (call begin_step first)");
  at::NoGradGuard no_grad;
  try {
    TORCHSPEED_PHASE("torchspeed.dist.zero_gather_wait", profile::Phase::Comm);
    for (size_t b = 0; b < works_.size(); ++b) {
      TORCH_CHECK(!works_[b].empty(), kName, ": bucket ", b, " was not gathered in this step");
      for (auto& w : works_[b]) w->wait();
      works_[b].clear();
      const at::Tensor& full = gathered_[b];
      for (const auto& [slot, offset] : bucket_slots_[b]) {
        if (!stepped_[slot]) continue;  // kept as a single-process optimizer leaves it
        const at::Tensor& p = params_[slot];
        at::Tensor flat = flat_view(p);
        if (flat.defined()) {
          flat.copy_(full.narrow(0, offset, p.numel()));
        } else {
          p.detach().copy_(full.narrow(0, offset, p.numel()).view(p.sizes()));
        }
        synced_version_[slot] = static_cast<int64_t>(p._version());
      }
    }
  } catch (...) {
    for (auto& bucket : works_) bucket.clear();
    restore_grads();
    synced_version_.assign(params_.size(), -1);
    in_step_ = false;
    throw;
  }
  restore_grads();
  in_step_ = false;
  ++stats_.zero_steps;
}

// ---- ZeroOptimizer ------------------------------------------------------------------------------

ZeroOptimizer::ZeroOptimizer(AccumulatingDDP& ddp, Factory make_optimizer)
    : ddp_(&ddp), shards_(std::make_shared<ZeroShards>(ddp)) {
  TORCH_CHECK_VALUE(static_cast<bool>(make_optimizer), kName,
                    ": make_optimizer must be a callable, got an empty std::function");
  for (int64_t b = 0; b < shards_->num_buckets(); ++b) {
    const auto& pieces = shards_->pieces(b);
    optimizers_.push_back(pieces.empty() ? nullptr
                                         : std::shared_ptr<torch::optim::Optimizer>(
                                               make_optimizer(pieces).release()));
  }
}

bool ZeroOptimizer::step(const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  if (!shards_->begin_step(grad_scale, found_inf)) return false;
  for (int64_t b = 0; b < shards_->num_buckets(); ++b) {
    if (optimizers_[b]) optimizers_[b]->step();
    shards_->launch_gather(b);  // runs while the next bucket's shard is stepped
  }
  shards_->finish_step();
  return true;
}

void ZeroOptimizer::zero_grad() { ddp_->zero_grad(); }

torch::optim::Optimizer* ZeroOptimizer::optimizer(int64_t bucket) const {
  TORCH_CHECK_INDEX(bucket >= 0 && bucket < shards_->num_buckets(), kName,
                    ": bucket must be in [0, ", shards_->num_buckets(), "), got ", bucket);
  return optimizers_[bucket].get();
}

}  // namespace torchspeed::dist
