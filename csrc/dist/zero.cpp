// ZeRO-1's shard layout and step collectives (ZeroShards) and the C++ ZeroOptimizer over them
// (include/torchspeed/dist/zero.h). Python's torchspeed.dist.ZeroOptimizer drives ZeroShards too.
#include "torchspeed/dist/zero.h"

#include <ATen/ATen.h>
#include <c10/util/Type.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>

#include "torchspeed/ops/optim.h"
#include "torchspeed/optim/lamb.h"
#include "torchspeed/profile/profile.h"

namespace torchspeed::dist {
namespace {

constexpr const char* kName = "torchspeed.dist.ZeroOptimizer";
constexpr const char* kLoad = "torchspeed.dist.ZeroOptimizer.load_state_dict";
constexpr const char* kFormat = "torchspeed.dist.zero1/v2";  // Python's _FORMAT

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
    lamb_ = lamb_ || dynamic_cast<optim::LAMB*>(optimizers_.back().get()) != nullptr;
  }
  // Every rank takes the same path (one all-reduce per LAMB step): a rank that owns no piece
  // has no optimizer to ask, so the kinds are compared across ranks.
  if (ddp_->world_size() > 1) {
    at::Tensor flag = at::full({1}, lamb_ ? 1.0 : 0.0, at::TensorOptions().dtype(at::kDouble));
    const auto buckets = ddp_->buckets();
    if (!buckets.empty()) flag = flag.to(buckets[0].device());
    std::vector<at::Tensor> tensors{flag};
    ddp_->process_group()->allreduce(tensors)->wait();
    lamb_ = flag.item<double>() > 0;
  }
  for (const auto& opt : optimizers_) {
    TORCH_CHECK_VALUE(!lamb_ || !opt || dynamic_cast<optim::LAMB*>(opt.get()) != nullptr, kName,
                      ": make_optimizer must make one kind of optimizer for every bucket, got "
                      "torchspeed::optim::LAMB for some and another kind for others");
  }
}

bool ZeroOptimizer::step(const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  if (!shards_->begin_step(grad_scale, found_inf)) return false;
  if (lamb_) {
    lamb_step();
  } else {
    for (int64_t b = 0; b < shards_->num_buckets(); ++b) {
      if (optimizers_[b]) optimizers_[b]->step();
      shards_->launch_gather(b);  // runs while the next bucket's shard is stepped
    }
  }
  shards_->finish_step();
  return true;
}

// LAMB's trust ratio needs each whole param's norms: phase 1 on every bucket (moments, each
// piece's ||p||^2 and ||u||^2), one all-reduce of those rows summed per param slot (on every rank,
// also one that owns nothing), then phase 2 (the update) and the gather, bucket by bucket. As
// Python's ZeroOptimizer._lamb_step.
void ZeroOptimizer::lamb_step() {
  const ZeroShards& z = *shards_;
  const auto buckets = ddp_->buckets();
  const at::Device device = buckets.empty() ? at::Device(at::kCPU) : buckets[0].device();
  at::Tensor total = at::zeros({static_cast<int64_t>(ddp_->slot_params().size()), 2},
                               at::TensorOptions().dtype(at::kDouble).device(device));
  std::vector<std::pair<std::vector<at::Tensor>, at::Tensor>> phase1(z.num_buckets());
  for (int64_t b = 0; b < z.num_buckets(); ++b) {
    auto* lamb = dynamic_cast<optim::LAMB*>(optimizers_[b].get());
    if (lamb == nullptr) continue;
    auto [params, norms] = lamb->sharded_step_phase1();
    std::unordered_map<const c10::TensorImpl*, int64_t> slot_of;
    for (size_t k = 0; k < z.pieces(b).size(); ++k) {
      slot_of[z.pieces(b)[k].unsafeGetTensorImpl()] = z.layout(b)[k].slot;
    }
    std::vector<int64_t> slots;
    for (const auto& p : params) slots.push_back(slot_of.at(p.unsafeGetTensorImpl()));
    at::Tensor index = at::tensor(slots, at::kLong).to(device);
    total.index_add_(0, index, norms.to(device));
    phase1[b] = {std::move(params), std::move(index)};
  }
  if (ddp_->world_size() > 1) {
    std::vector<at::Tensor> tensors{total};
    ddp_->process_group()->allreduce(tensors)->wait();
  }
  for (int64_t b = 0; b < z.num_buckets(); ++b) {
    auto* lamb = dynamic_cast<optim::LAMB*>(optimizers_[b].get());
    if (lamb != nullptr && !phase1[b].first.empty()) {
      lamb->sharded_step_phase2(phase1[b].first, total.index_select(0, phase1[b].second));
    }
    shards_->launch_gather(b);
  }
}

void ZeroOptimizer::zero_grad() { ddp_->zero_grad(); }

torch::optim::Optimizer* ZeroOptimizer::optimizer(int64_t bucket) const {
  TORCH_CHECK_INDEX(bucket >= 0 && bucket < shards_->num_buckets(), kName,
                    ": bucket must be in [0, ", shards_->num_buckets(), "), got ", bucket);
  return optimizers_[bucket].get();
}

// ---- checkpoints: Python's v2 layout, re-sharded per param -----------------------------------
// An optimizer's state is read and written through its own save()/load() (torch::optim's archive:
// per param a sub-archive of named values, per group its options), so any torch::optim optimizer
// and torchspeed's fused ones work; the values travel by name, as in Python's state dicts.

namespace {

using Named = std::vector<std::pair<std::string, c10::IValue>>;  // in the optimizer's order

struct BucketState {
  std::map<int64_t, Named> state;  // piece index -> its state
  Named options;                   // the bucket's one param group, without "params"
  bool has_group = false;
};

c10::impl::GenericDict str_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

c10::IValue int_rows(const std::vector<std::vector<int64_t>>& rows) {
  c10::impl::GenericList out(c10::ListType::ofInts());
  for (const auto& r : rows) out.push_back(c10::List<int64_t>(r));
  return out;
}

std::string dtype_name(at::ScalarType t) {  // as Python prints it: "torch.float64"
  return "torch." + std::string(c10::getDtypeNames(t).first);
}

std::unique_ptr<torch::serialize::InputArchive> reopen(torch::serialize::OutputArchive& out) {
  std::stringstream bytes;
  out.save_to(bytes);
  auto in = std::make_unique<torch::serialize::InputArchive>();
  in->load_from(bytes);
  return in;
}

Named read_values(torch::serialize::InputArchive& archive) {
  Named out;
  for (const std::string& key : archive.keys()) {
    if (key == "training") continue;  // the archive module's own flag, no value of ours
    c10::IValue v;
    archive.read(key, v);
    out.emplace_back(key, v);
  }
  return out;
}

BucketState read_optimizer(const torch::optim::Optimizer& opt) {
  torch::serialize::OutputArchive out;
  opt.save(out);
  auto in = reopen(out);
  BucketState b;
  torch::serialize::InputArchive groups, group, options, states;
  in->read("param_groups", groups);
  groups.read("param_groups/0", group);  // the pieces: one group
  at::Tensor size;
  group.read("params/size", size);
  std::map<std::string, int64_t> index;  // the archive's param key -> piece index
  for (int64_t i = 0; i < size.item<int64_t>(); ++i) {
    c10::IValue key;
    group.read("params/" + std::to_string(i), key);
    index[key.toStringRef()] = i;
  }
  group.read("options", options);
  b.options = read_values(options);
  b.has_group = true;
  in->read("state", states);
  for (const std::string& key : states.keys()) {
    if (key == "training") continue;
    torch::serialize::InputArchive one;
    states.read(key, one);
    b.state[index.at(key)] = read_values(one);
  }
  return b;
}

std::unique_ptr<torch::serialize::InputArchive> write_optimizer(const BucketState& b,
                                                                int64_t num_params) {
  torch::serialize::OutputArchive out;
  const auto cu = out.compilation_unit();
  out.write("pytorch_version", c10::IValue("1.5.0"));
  torch::serialize::OutputArchive states(cu), groups(cu), group(cu), options(cu);
  for (const auto& [k, values] : b.state) {
    torch::serialize::OutputArchive one(cu);
    for (const auto& [key, v] : values) one.write(key, v);
    states.write(std::to_string(k + 1), one);
  }
  out.write("state", states);
  groups.write("param_groups/size", at::tensor(int64_t{1}));
  group.write("params/size", at::tensor(num_params));
  for (int64_t i = 0; i < num_params; ++i) {
    group.write("params/" + std::to_string(i), c10::IValue(std::to_string(i + 1)));
  }
  for (const auto& [key, v] : b.options) options.write(key, v);
  group.write("options", options);
  groups.write("param_groups/0", group);
  out.write("param_groups", groups);
  return reopen(out);
}

// ---- reading a state dict (ours or Python's), with errors that say which and what -------------

c10::IValue field(const c10::IValue& d, const char* key, size_t i) {
  const auto dict = d.toGenericDict();
  TORCH_CHECK_VALUE(dict.contains(key), kLoad, ": state_dicts[", i,
                    "] must be a ZeroOptimizer state dict with '", key, "', got none");
  return dict.at(key);
}

std::vector<int64_t> ints(const c10::IValue& v) {
  std::vector<int64_t> out;
  for (const c10::IValue& x : v.toListRef()) out.push_back(x.toInt());
  return out;
}

std::vector<std::vector<int64_t>> int_rows_of(const c10::IValue& v) {
  std::vector<std::vector<int64_t>> out;
  for (const c10::IValue& r : v.toListRef()) out.push_back(ints(r));
  return out;
}

Named named_of(const c10::IValue& d, bool skip_params) {
  Named out;
  for (const auto& item : d.toGenericDict()) {
    const std::string& key = item.key().toStringRef();
    if (skip_params && key == "params") continue;
    out.emplace_back(key, item.value());
  }
  return out;
}

// A state dict's bucket b: its optimizer state by piece index and its group's options.
BucketState bucket_of(const c10::IValue& d, size_t b, size_t i) {
  const auto shards = field(d, "shards", i).toListRef();
  TORCH_CHECK_VALUE(b < shards.size(), kLoad, ": state_dicts[", i,
                    "] must have a shard per bucket (", b + 1, " or more), got ", shards.size());
  BucketState out;
  const c10::IValue& shard = shards[b];
  for (const auto& item : field(shard, "state", i).toGenericDict()) {
    out.state[item.key().toInt()] = named_of(item.value(), false);
  }
  const auto groups = field(shard, "param_groups", i).toListRef();
  if (!groups.empty()) {
    out.options = named_of(groups[0], true);
    out.has_group = true;
  }
  return out;
}

bool elementwise(const c10::IValue& v) { return v.isTensor() && v.toTensor().dim() == 1; }

const c10::IValue* find_named(const Named& values, const std::string& key) {
  for (const auto& [name, v] : values) {
    if (name == key) return &v;
  }
  return nullptr;
}

// A piece's state with every value per element, for re-sharding: the int8 moments of
// torchspeed's low-bit optimizers (state_dtype "int8": codes plus "<key>_absmax", one absmax per
// block of the group's state_block elements, the blocks starting at the piece's first element)
// decoded to float32 by the step's own decoder, since blocks cut at a piece's ends can be neither
// joined nor cut per element. The new pieces' optimizers quantize them again in their own blocks
// as they load them (as they convert any float32 state). Everything else is per element already
// (float32 or bfloat16 moments, a step count). As Python's zero._per_element.
constexpr const char* kAbsmax = "_absmax";

// Whether `key` is the per-block absmax of another value of `values` (an int8 moment's codes):
// one value per block, not per element.
bool is_absmax(const Named& values, const std::string& key) {
  const size_t n = std::char_traits<char>::length(kAbsmax);
  return key.size() > n && key.compare(key.size() - n, n, kAbsmax) == 0 &&
         find_named(values, key.substr(0, key.size() - n)) != nullptr;
}

Named per_element(Named values, const Named& options, const std::string& where) {
  const std::string suffix = kAbsmax;
  bool any = false;
  for (const auto& [key, v] : values) any = any || is_absmax(values, key);
  if (!any) return values;
  const c10::IValue* block = find_named(options, "state_block");
  const int64_t state_block = block == nullptr ? 256 : block->isInt() ? block->toInt() : -1;
  TORCH_CHECK_VALUE(state_block >= 1, kLoad, ": ", where,
                    "'s group state_block must be the int block of its int8 state, got ",
                    block == nullptr ? c10::IValue() : *block);
  Named out;
  for (const auto& [key, v] : values) {
    if (is_absmax(values, key)) continue;
    const c10::IValue* absmax = find_named(values, key + suffix);
    if (absmax == nullptr) {
      out.emplace_back(key, v);
      continue;
    }
    TORCH_CHECK_VALUE(v.isTensor() && absmax->isTensor(), kLoad, ": ", where, "'s '", key,
                      "' and '", key, suffix,
                      "' must be tensors (int8 codes and their absmaxes), "
                      "got ",
                      v.tagKind(), " and ", absmax->tagKind());
    const at::Tensor a = absmax->toTensor().cpu();
    TORCH_CHECK_VALUE(a.scalar_type() != at::kFloat ||
                          (at::isfinite(a).all().item<bool>() && !(a < 0).any().item<bool>()),
                      kLoad, ": ", where, "'s '", key, suffix,
                      "' must hold finite absmaxes >= 0, got min ",
                      a.numel() ? a.min().item<float>() : 0.0f, " max ",
                      a.numel() ? a.max().item<float>() : 0.0f);
    LowbitDecodeArgs d;
    d.codes = v.toTensor().cpu().reshape({-1});
    d.absmax = a;
    d.state_block = state_block;
    try {
      out.emplace_back(key, lowbit_decode(d));
    } catch (const c10::Error& e) {
      TORCH_CHECK_VALUE(false, kLoad, ": ", where, "'s '", key, "' (state_block ", state_block,
                        "): ", e.what_without_backtrace());
    }
  }
  return out;
}

}  // namespace

c10::IValue ZeroOptimizer::state_dict() const {
  const ZeroShards& z = *shards_;
  const auto buckets = ddp_->buckets();
  const auto slots = ddp_->param_slots();
  const auto params = ddp_->slot_params();
  c10::impl::GenericList layout(c10::AnyType::get()), shards(c10::AnyType::get());
  std::string optimizer_class;
  for (int64_t b = 0; b < z.num_buckets(); ++b) {
    std::vector<std::vector<int64_t>> in_bucket, pieces;  // in slot order, as Python lists them
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i].first == b) {
        in_bucket.push_back({static_cast<int64_t>(i), slots[i].second, params[i].numel()});
      }
    }
    for (const ZeroPiece& p : z.layout(b)) pieces.push_back({p.slot, p.param_offset, p.numel});
    auto entry = str_dict();
    entry.insert("padded", buckets[b].numel());
    entry.insert("dtype", dtype_name(buckets[b].scalar_type()));
    entry.insert("params", int_rows(in_bucket));
    entry.insert("pieces", int_rows(pieces));
    layout.push_back(entry);

    auto shard = str_dict();
    c10::impl::GenericDict state(c10::IntType::get(), c10::AnyType::get());
    c10::impl::GenericList groups(c10::AnyType::get());
    if (optimizers_[b]) {
      if (optimizer_class.empty()) optimizer_class = c10::demangle(typeid(*optimizers_[b]).name());
      BucketState s = read_optimizer(*optimizers_[b]);
      for (const auto& [k, values] : s.state) {
        auto one = str_dict();
        for (const auto& [key, v] : values) one.insert(key, v);
        state.insert(k, one);
      }
      auto group = str_dict();
      for (const auto& [key, v] : s.options) group.insert(key, v);
      std::vector<int64_t> idx(z.layout(b).size());
      for (size_t k = 0; k < idx.size(); ++k) idx[k] = static_cast<int64_t>(k);
      group.insert("params", c10::List<int64_t>(idx));
      groups.push_back(group);
    }
    shard.insert("state", state);
    shard.insert("param_groups", groups);
    shards.push_back(shard);
  }
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& p : params) shapes.push_back(p.sizes().vec());
  auto out = str_dict();
  out.insert("format", std::string(kFormat));
  out.insert("world_size", ddp_->world_size());
  out.insert("rank", ddp_->rank());
  out.insert("optimizer_class", optimizer_class);
  out.insert("layout", layout);
  out.insert("param_shapes", int_rows(shapes));
  out.insert("shards", shards);
  return out;
}

void ZeroOptimizer::load_state_dict(const std::vector<c10::IValue>& dicts) {
  const ZeroShards& z = *shards_;
  const c10::IValue mine = state_dict();  // our layout, to compare with
  const auto my_layout = field(mine, "layout", 0).toListRef();
  const auto my_shapes = int_rows_of(field(mine, "param_shapes", 0));
  TORCH_CHECK_VALUE(!dicts.empty(), kLoad,
                    ": state_dicts must hold this rank's state dict or every rank's, got none");
  int64_t world = -1;
  for (size_t i = 0; i < dicts.size(); ++i) {
    const c10::IValue& d = dicts[i];
    TORCH_CHECK_TYPE(d.isGenericDict(), kLoad, ": state_dicts[", i,
                     "] must be a dict (ZeroOptimizer::state_dict()), got ", d.tagKind());
    const auto dict = d.toGenericDict();
    TORCH_CHECK_VALUE(dict.contains("format") && dict.at("format").isString() &&
                          dict.at("format").toStringRef() == kFormat,
                      kLoad, ": state_dicts[", i, "] must be a ZeroOptimizer state dict (format ",
                      kFormat, "), got format ",
                      dict.contains("format") ? dict.at("format") : c10::IValue("none"));
    const int64_t w = field(d, "world_size", i).toInt(), r = field(d, "rank", i).toInt();
    if (world < 0) world = w;
    TORCH_CHECK_VALUE(w == world && (dicts.size() == 1 || r == static_cast<int64_t>(i)), kLoad,
                      ": state_dicts must hold every rank's state dict in rank order, got rank ", r,
                      " of world size ", w, " at index ", i);
    const auto layout = field(d, "layout", i).toListRef();
    bool same =
        layout.size() == my_layout.size() && int_rows_of(field(d, "param_shapes", i)) == my_shapes;
    for (size_t b = 0; same && b < layout.size(); ++b) {
      same = field(layout[b], "dtype", i).toStringRef() ==
                 field(my_layout[b], "dtype", 0).toStringRef() &&
             int_rows_of(field(layout[b], "params", i)) ==
                 int_rows_of(field(my_layout[b], "params", 0));
    }
    TORCH_CHECK_VALUE(same, kLoad, ": state_dicts[", i,
                      "] must be written for this model and bucket layout, got another (",
                      layout.size(), " buckets, ", my_layout.size(), " here)");
  }
  const bool own = dicts.size() == 1 && world == ddp_->world_size();
  TORCH_CHECK_VALUE(own || static_cast<int64_t>(dicts.size()) == world, kLoad,
                    ": re-sharding a world size ", world,
                    " checkpoint needs every rank's state dict, got ", dicts.size());
  if (own) {
    const int64_t r = field(dicts[0], "rank", 0).toInt();
    TORCH_CHECK_VALUE(r == ddp_->rank(), kLoad, ": state_dicts[0] must be rank ", ddp_->rank(),
                      "'s shard (or every rank's dicts, to re-shard), got rank ", r, "'s");
  }

  // The new state of every bucket, built in full before any optimizer changes.
  const int64_t nb = z.num_buckets();
  std::vector<BucketState> next(nb);
  if (own) {
    for (int64_t b = 0; b < nb; ++b) {
      next[b] = bucket_of(dicts[0], b, 0);
      const auto& pieces = z.layout(b);
      for (const auto& [k, values] : next[b].state) {
        TORCH_CHECK_VALUE(k >= 0 && k < static_cast<int64_t>(pieces.size()), kLoad,
                          ": state_dicts[0] bucket ", b, " must have state for its ", pieces.size(),
                          " pieces only, got piece ", k);
        for (const auto& [key, v] : values) {
          // An int8 moment's absmaxes (one per block) are checked by the optimizer's load.
          TORCH_CHECK_VALUE(
              !elementwise(v) || is_absmax(values, key) || v.toTensor().numel() == pieces[k].numel,
              kLoad, ": state_dicts[0] bucket ", b, " piece ", k, "'s state '", key, "' must have ",
              pieces[k].numel, " values, got ", v.toTensor().numel());
        }
      }
    }
  } else {
    // Per slot: the old pieces (offset, numel, state), then per name the full flat value.
    std::map<int64_t, std::vector<std::tuple<int64_t, int64_t, Named>>> parts;
    for (size_t i = 0; i < dicts.size(); ++i) {
      const auto layout = field(dicts[i], "layout", i).toListRef();
      for (int64_t b = 0; b < nb; ++b) {
        BucketState s = bucket_of(dicts[i], b, i);
        const auto pieces = int_rows_of(field(layout[b], "pieces", i));
        for (auto& [k, values] : s.state) {
          TORCH_CHECK_VALUE(k >= 0 && k < static_cast<int64_t>(pieces.size()), kLoad,
                            ": state_dicts[", i, "] bucket ", b, " must have state for its ",
                            pieces.size(), " pieces only, got piece ", k);
          const auto& piece = pieces[k];
          parts[piece[0]].emplace_back(
              piece[1], piece[2],
              per_element(std::move(values), s.options,
                          c10::str("state_dicts[", i, "] bucket ", b, " piece ", k)));
        }
        if (!next[b].has_group && s.has_group) {
          next[b].options = s.options;
          next[b].has_group = true;
        }
      }
    }
    std::map<int64_t, std::map<std::string, c10::IValue>> full;  // slot -> name -> value
    std::map<int64_t, Named> order;                              // names in the optimizer's order
    const auto params = ddp_->slot_params();
    for (auto& [slot, pieces] : parts) {
      std::sort(pieces.begin(), pieces.end(),
                [](const auto& x, const auto& y) { return std::get<0>(x) < std::get<0>(y); });
      int64_t covered = 0;
      for (const auto& [off, n, values] : pieces) {
        TORCH_CHECK_VALUE(off == covered, kLoad, ": param ", slot,
                          " must have optimizer state for all of its elements or none (the "
                          "state dicts of one step), got a gap or overlap at element ",
                          covered);
        covered += n;
      }
      const int64_t numel = slot < static_cast<int64_t>(params.size()) ? params[slot].numel() : -1;
      TORCH_CHECK_VALUE(covered == numel, kLoad, ": param ", slot,
                        " must have optimizer state for all of its ", numel,
                        " elements or none, got ", covered);
      // Every piece's keys: a low-bit SGD keeps a step count beside its int8 / bf16 buffers only,
      // so a param cut into an int8 piece and a small float32 one has it in one of them.
      Named first;
      for (const auto& piece : pieces) {
        for (const auto& [key, v] : std::get<2>(piece)) {
          if (find_named(first, key) == nullptr) first.emplace_back(key, v);
        }
      }
      order[slot] = first;
      for (const auto& [key, v0] : first) {
        if (!elementwise(v0)) {
          full[slot][key] = v0;
          continue;
        }
        std::vector<at::Tensor> cat;
        for (const auto& [off, n, values] : pieces) {
          const auto it = std::find_if(values.begin(), values.end(),
                                       [&](const auto& kv) { return kv.first == key; });
          TORCH_CHECK_VALUE(
              it != values.end() && elementwise(it->second) && it->second.toTensor().numel() == n,
              kLoad, ": param ", slot, "'s state '", key, "' must be elementwise in every piece (",
              n, " values for a piece of ", n, " elements), got ",
              it == values.end() ? c10::IValue("none") : it->second);
          cat.push_back(it->second.toTensor().cpu());
        }
        full[slot][key] = at::cat(cat);
      }
    }
    for (int64_t b = 0; b < nb; ++b) {
      const auto& pieces = z.layout(b);
      for (size_t k = 0; k < pieces.size(); ++k) {
        const ZeroPiece& piece = pieces[k];
        const auto it = full.find(piece.slot);
        if (it == full.end()) continue;  // never had a gradient: no state, as in torch.optim
        Named values;
        for (const auto& [key, v0] : order[piece.slot]) {
          const c10::IValue& v = it->second.at(key);
          values.emplace_back(key, elementwise(v0)
                                       ? c10::IValue(v.toTensor()
                                                         .narrow(0, piece.param_offset, piece.numel)
                                                         .to(z.pieces(b)[k].device())
                                                         .clone())
                                       : v);
        }
        next[b].state[static_cast<int64_t>(k)] = std::move(values);
      }
    }
  }
  for (int64_t b = 0; b < nb; ++b) {
    TORCH_CHECK_VALUE(!optimizers_[b] || next[b].has_group, kLoad, ": bucket ", b,
                      " must have its optimizer's options in some rank's state dict, got none");
  }
  // Each optimizer loads its part through its own load(); one that refuses it gets every bucket's
  // old state back. The values go in as written, then once more with 0-dim tensors as numbers:
  // Python's torch.optim keeps a step count as a tensor where torch::optim's C++ state has an int.
  std::vector<std::unique_ptr<torch::serialize::InputArchive>> backup(nb);
  for (int64_t b = 0; b < nb; ++b) {
    if (!optimizers_[b]) continue;
    torch::serialize::OutputArchive out;
    optimizers_[b]->save(out);
    backup[b] = reopen(out);
  }
  std::string refusal;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (attempt == 1) {
      for (BucketState& s : next) {
        for (auto& [k, values] : s.state) {
          for (auto& [key, v] : values) {
            if (!v.isTensor() || v.toTensor().dim() != 0) continue;
            const at::Tensor t = v.toTensor();
            const double x = t.item<double>();
            v = x == std::trunc(x) ? c10::IValue(static_cast<int64_t>(x)) : c10::IValue(x);
          }
        }
      }
    }
    int64_t b = 0;
    try {
      for (; b < nb; ++b) {
        if (!optimizers_[b]) continue;
        optimizers_[b]->load(*write_optimizer(next[b], z.pieces(b).size()));
      }
      return;
    } catch (const c10::Error& e) {
      refusal = "bucket " + std::to_string(b) + ": " + e.what_without_backtrace();
      for (int64_t r = 0; r <= b && r < nb; ++r) {
        if (!optimizers_[r]) continue;
        optimizers_[r]->state().clear();
        optimizers_[r]->load(*backup[r]);
      }
    }
  }
  TORCH_CHECK_VALUE(false, kLoad,
                    ": every bucket's optimizer must accept its state and options by name (an "
                    "optimizer of the kind that wrote them), got a refusal from ",
                    refusal, "; nothing was loaded");
}

}  // namespace torchspeed::dist
