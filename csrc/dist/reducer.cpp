// The reducer of torchspeed::dist::AccumulatingDDP (see reducer.h and the public ddp.h).
//
// Lifecycle of one accumulation window of k micro-steps:
//   micro-steps 1..k-1: AccumulateGrad adds into the bucket views in place; the hooks only note
//     that the param was used; end_backward counts the pass. No collective, no copy.
//   micro-step k: begin_micro_step arms the reducer (join check and buffer broadcast first); each
//     hook marks its slot ready, and the bucket whose last slot became ready is launched as soon as
//     every bucket before it is: scale_cast_ (1/world, and the compression cast) then an async
//     all-reduce. end_backward launches what is left (params without a gradient in this
//     micro-step), waits for every bucket, widens compressed buckets back and, with
//     find_unused_parameters, votes on the params no rank used.
// Every rank launches the buckets in the same index order, so the collectives match.
#include "dist/reducer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>

#include "torchspeed/ops.h"
#include "torchspeed/ops/dist.h"
#include "torchspeed/profile/profile.h"

namespace torchspeed::dist {
namespace {

constexpr const char* kName = "torchspeed.dist.AccumulatingDDP";

at::ScalarType parse_compression(const std::string& c) {
  if (c == "none" || c.empty()) return at::kFloat;
  if (c == "bf16" || c == "bfloat16") return at::kBFloat16;
  if (c == "fp16" || c == "float16") return at::kHalf;
  TORCH_CHECK_VALUE(false, kName, ": compression must be 'none', 'bf16' or 'fp16', got '", c, "'");
}

// A bucket cap in MiB, as bytes: finite and > 0 (validate), at most 2^62 bytes (a huge cap means
// one bucket per dtype and device, without overflowing the conversion).
int64_t cap_to_bytes(double mb) {
  return static_cast<int64_t>(std::min(mb * 1024.0 * 1024.0, 4.611686018427388e18));
}

// ---- the cross-rank consistency check ----------------------------------------------------------
// One row of int64 per rank, summed by one all-reduce (each rank fills only its own row): the
// counts, the options that shape the collectives, and a hash of every tensor's description. Only
// when the rows differ does a second all-reduce gather the descriptions themselves, to name the
// first tensor that differs; every rank computes the same message and raises it.

enum HeaderField : int64_t {
  kParams,
  kBuffers,
  kAccumulationSteps,
  kBucketCap,
  kFirstBucketCap,
  kCompression,
  kFindUnused,
  kBroadcastBuffers,
  kZero,
  kDescriptionHash,
  kHeaderFields
};
constexpr const char* kHeaderNames[] = {"the number of parameters",
                                        "the number of buffers",
                                        "accumulation_steps",
                                        "bucket_cap_mb",
                                        "first_bucket_cap_mb",
                                        "compression",
                                        "find_unused_parameters",
                                        "broadcast_buffers",
                                        "zero",
                                        ""};
constexpr int64_t kMaxDims = 8;
// dtype, device type, requires_grad, ndim, sizes (the 8th folds any further dims in).
constexpr int64_t kDescriptionFields = 4 + kMaxDims;

int64_t double_bits(double v) {
  int64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
}

double bits_double(int64_t bits) {
  double v = 0;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

void describe(const at::Tensor& t, int64_t* d) {
  d[0] = static_cast<int64_t>(t.scalar_type());
  d[1] = static_cast<int64_t>(t.device().type());
  d[2] = t.requires_grad() ? 1 : 0;
  d[3] = t.dim();
  for (int64_t i = 0; i < kMaxDims; ++i) d[4 + i] = i < t.dim() ? t.size(i) : 0;
  for (int64_t i = kMaxDims; i < t.dim(); ++i) d[4 + kMaxDims - 1] *= t.size(i);
}

std::string description_text(const int64_t* d, bool is_param) {
  std::ostringstream o;
  o << c10::toString(static_cast<at::ScalarType>(d[0])) << " [";
  for (int64_t i = 0; i < std::min(d[3], kMaxDims); ++i) o << (i ? ", " : "") << d[4 + i];
  o << (d[3] > kMaxDims ? ", ...]" : "]");
  if (static_cast<c10::DeviceType>(d[1]) != c10::DeviceType::CPU) {
    o << " on " << c10::DeviceTypeName(static_cast<c10::DeviceType>(d[1]), /*lower_case=*/true);
  }
  o << (d[2] || !is_param ? "" : " (requires_grad=False)");
  return o.str();
}

std::string header_value_text(int64_t field, int64_t v) {
  switch (field) {
    case kBucketCap:
    case kFirstBucketCap: {
      std::ostringstream o;
      o << bits_double(v);
      return o.str();
    }
    case kCompression:
      return v == static_cast<int64_t>(at::kBFloat16) ? "'bf16'"
             : v == static_cast<int64_t>(at::kHalf)   ? "'fp16'"
                                                      : "None";
    case kFindUnused:
    case kBroadcastBuffers:
      return v ? "True" : "False";
    default:
      return std::to_string(v);
  }
}

// Every option's value, before anything is built or communicated (ValueError in Python).
void validate(const DDPOptions& o) {
  TORCH_CHECK_VALUE(o.accumulation_steps() >= 1, kName, ": accumulation_steps must be >= 1, got ",
                    o.accumulation_steps());
  TORCH_CHECK_VALUE(o.bucket_cap_mb() > 0 && std::isfinite(o.bucket_cap_mb()), kName,
                    ": bucket_cap_mb must be finite and > 0, got ", o.bucket_cap_mb());
  TORCH_CHECK_VALUE(o.first_bucket_cap_mb() > 0 && std::isfinite(o.first_bucket_cap_mb()), kName,
                    ": first_bucket_cap_mb must be finite and > 0, got ", o.first_bucket_cap_mb());
  TORCH_CHECK_VALUE(o.zero() == 0 || o.zero() == 1, kName, ": zero must be 0 or 1, got ", o.zero());
}

}  // namespace

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<at::Tensor> buffers,
                 c10::intrusive_ptr<c10d::ProcessGroup> group, DDPOptions options,
                 std::vector<std::string> param_names, std::vector<std::string> buffer_names)
    : group_(std::move(group)), options_(std::move(options)), buffers_(std::move(buffers)) {
  TORCH_CHECK_TYPE(group_, kName, ": process_group must be a c10d ProcessGroup, got None");
  validate(options_);
  wire_dtype_ = parse_compression(options_.compression());
  rank_ = group_->getRank();
  world_ = group_->getSize();
  if (options_.zero() == 1) {
    // Gloo's reduce_scatter and all_gather are 4x slower than its ring all-reduce (100 MB fp32 on
    // 2 ranks: 589 and 472 ms against 138 ms), so on Gloo the shards are cut from an all-reduce
    // (same math) and ZeroShards gathers the params with one broadcast per rank
    // (TORCHSPEED_ZERO_COLLECTIVES=native or all_reduce overrides). NCCL and others use
    // reduce-scatter and all-gather.
    const char* env = std::getenv("TORCHSPEED_ZERO_COLLECTIVES");
    const std::string mode = env ? env : "";
    TORCH_CHECK_VALUE(mode.empty() || mode == "native" || mode == "all_reduce", kName,
                      ": TORCHSPEED_ZERO_COLLECTIVES must be 'native' or 'all_reduce', got '", mode,
                      "'");
    zero_by_all_reduce_ = mode.empty() ? group_->getBackendName() == "gloo" : mode == "all_reduce";
  }
  stats_.world_size = world_;

  // Distinct params (a tied weight appears once), each a dense leaf; trainable ones get a slot.
  std::vector<const c10::TensorImpl*> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    TORCH_CHECK(p.defined(), kName, ": params[", i, "] must be a tensor, got None");
    if (std::find(seen.begin(), seen.end(), p.unsafeGetTensorImpl()) != seen.end()) continue;
    seen.push_back(p.unsafeGetTensorImpl());
    TORCH_CHECK(p.layout() == at::kStrided, kName, ": params[", i,
                "] must be a dense (strided) tensor, got layout ", p.layout());
    all_params_.push_back(p);
    param_names_.push_back(i < param_names.size() && !param_names[i].empty()
                               ? "params[" + std::to_string(i) + "] (" + param_names[i] + ")"
                               : "params[" + std::to_string(i) + "]");
    if (!p.requires_grad()) continue;
    TORCH_CHECK(p.is_leaf(), kName, ": params[", i,
                "] must be a leaf tensor (a module parameter), got one computed from others");
    TORCH_CHECK(at::isFloatingType(p.scalar_type()), kName, ": params[", i,
                "] must be floating point to be trained, got ", p.scalar_type());
    Slot s;
    s.param = p;
    slots_.push_back(std::move(s));
  }
  for (size_t i = 0; i < buffers_.size(); ++i) {
    TORCH_CHECK(buffers_[i].defined() && buffers_[i].layout() == at::kStrided, kName, ": buffers[",
                i, "] must be a dense tensor");
    buffer_names_.push_back(i < buffer_names.size() && !buffer_names[i].empty()
                                ? "buffers[" + std::to_string(i) + "] (" + buffer_names[i] + ")"
                                : "buffers[" + std::to_string(i) + "]");
  }
  // Before the first collective that depends on the model: a rank with another model would
  // otherwise feed Gloo/NCCL buffers of other sizes (Gloo aborts the process).
  if (world_ > 1) verify_same_model_and_options();
  broadcast_all_from_rank0();
  build_buckets();
  install_hooks();
}

Reducer::~Reducer() {
  for (auto& s : slots_) {
    if (s.accumulator) s.accumulator->del_post_hook(s.hook_key);
  }
  for (auto& b : buckets_) {
    if (!b.work) continue;
    try {
      b.work->wait();
    } catch (...) {  // a destructor must not throw; the error was or will be seen elsewhere
    }
  }
}

// ---- construction
// ---------------------------------------------------------------------------------

void Reducer::verify_same_model_and_options() {
  const int64_t n_params = static_cast<int64_t>(all_params_.size());
  const int64_t n_buffers = static_cast<int64_t>(buffers_.size());
  std::vector<int64_t> mine(static_cast<size_t>((n_params + n_buffers) * kDescriptionFields));
  for (int64_t i = 0; i < n_params + n_buffers; ++i) {
    describe(i < n_params ? all_params_[i] : buffers_[i - n_params], &mine[i * kDescriptionFields]);
  }
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the descriptions
  for (int64_t v : mine) {
    for (int byte = 0; byte < 8; ++byte) {
      hash = (hash ^ ((static_cast<uint64_t>(v) >> (8 * byte)) & 0xff)) * 1099511628211ull;
    }
  }
  at::Tensor rows = at::zeros({world_, kHeaderFields}, at::kLong);
  int64_t* h = rows.data_ptr<int64_t>() + rank_ * kHeaderFields;
  h[kParams] = n_params;
  h[kBuffers] = n_buffers;
  h[kAccumulationSteps] = options_.accumulation_steps();
  h[kBucketCap] = double_bits(options_.bucket_cap_mb());
  h[kFirstBucketCap] = double_bits(options_.first_bucket_cap_mb());
  h[kCompression] = static_cast<int64_t>(wire_dtype_);
  h[kFindUnused] = options_.find_unused_parameters();
  h[kBroadcastBuffers] = options_.broadcast_buffers();
  h[kZero] = options_.zero();
  h[kDescriptionHash] = static_cast<int64_t>(hash);
  const auto sum_rows = [&](at::Tensor t) {
    std::vector<at::Tensor> tensors{t.to(control_device())};
    group_->allreduce(tensors)->wait();
    ++stats_.control_collectives;
    return tensors[0].cpu();
  };
  const at::Tensor all = sum_rows(rows);
  const int64_t* a = all.data_ptr<int64_t>();
  const auto row = [&](int64_t r) { return a + r * kHeaderFields; };
  bool same = true;
  int64_t min_params = n_params, min_buffers = n_buffers;
  for (int64_t r = 0; r < world_; ++r) {
    same = same && std::equal(row(r), row(r) + kHeaderFields, row(0));
    min_params = std::min(min_params, row(r)[kParams]);
    min_buffers = std::min(min_buffers, row(r)[kBuffers]);
  }
  if (same) return;
  const std::string prefix = std::string(kName) +
                             ": every rank must wrap the same model with the "
                             "same options (as torch's DDP requires), but ";
  bool any_hash_or_count_differs = false;
  for (int64_t r = 1; r < world_; ++r) {
    for (int64_t f : {kParams, kBuffers, kDescriptionHash}) {
      any_hash_or_count_differs |= row(r)[f] != row(0)[f];
    }
  }
  if (any_hash_or_count_differs) {
    // Gather the descriptions every rank has (its first min_params params and min_buffers
    // buffers): the same size on every rank, computed from the rows all of them received.
    const int64_t n = min_params + min_buffers;
    at::Tensor d = at::zeros({world_, n * kDescriptionFields}, at::kLong);
    int64_t* dm = d.data_ptr<int64_t>() + rank_ * n * kDescriptionFields;
    std::copy(mine.begin(), mine.begin() + min_params * kDescriptionFields, dm);
    std::copy(mine.begin() + n_params * kDescriptionFields,
              mine.begin() + (n_params + min_buffers) * kDescriptionFields,
              dm + min_params * kDescriptionFields);
    const at::Tensor got = sum_rows(d);
    const int64_t* g = got.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t* d0 = g + i * kDescriptionFields;
      for (int64_t r = 1; r < world_; ++r) {
        const int64_t* dr = g + (r * n + i) * kDescriptionFields;
        if (std::equal(dr, dr + kDescriptionFields, d0)) continue;
        // This rank knows the names of its own tensors; the index is the same on every rank.
        const std::string& what = i < min_params ? param_names_[i] : buffer_names_[i - min_params];
        const bool is_param = i < min_params;
        TORCH_CHECK_VALUE(false, prefix, what, " is ", description_text(dr, is_param), " on rank ",
                          r, " and ", description_text(d0, is_param), " on rank 0");
      }
    }
  }
  for (int64_t f = 0; f < kDescriptionHash; ++f) {
    for (int64_t r = 1; r < world_; ++r) {
      TORCH_CHECK_VALUE(row(r)[f] == row(0)[f], prefix, kHeaderNames[f], " is ",
                        header_value_text(f, row(r)[f]), " on rank ", r, " and ",
                        header_value_text(f, row(0)[f]), " on rank 0");
    }
  }
  TORCH_CHECK_VALUE(false, prefix, "the parameters and buffers differ between ranks");
}

void Reducer::build_buckets() {
  // Reverse parameter order: the last layers' gradients are ready first in backward. One open
  // bucket per (device, dtype); it is closed when adding a param would pass the cap (the first
  // bucket's cap is smaller, so the first all-reduce starts early). A larger param gets its own.
  using Key = std::tuple<int, int, int>;  // device type, device index, dtype
  std::map<Key, size_t> open;
  std::vector<int64_t> numel_of;  // per bucket
  const auto cap_bytes = [&](size_t bucket_index) {
    return cap_to_bytes(bucket_index == 0 ? options_.first_bucket_cap_mb()
                                          : options_.bucket_cap_mb());
  };
  for (size_t j = slots_.size(); j-- > 0;) {
    Slot& s = slots_[j];
    const at::Tensor& p = s.param;
    const Key key{static_cast<int>(p.device().type()), p.device().index(),
                  static_cast<int>(p.scalar_type())};
    auto it = open.find(key);
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    if (it != open.end()) {
      const size_t b = it->second;
      const int64_t used = numel_of[b] * static_cast<int64_t>(p.element_size());
      if (used > 0 && used + bytes > cap_bytes(b)) open.erase(it), it = open.end();
    }
    if (it == open.end()) {
      buckets_.emplace_back();
      numel_of.push_back(0);
      it = open.emplace(key, buckets_.size() - 1).first;
    }
    const size_t b = it->second;
    s.bucket = static_cast<int64_t>(b);
    s.offset = numel_of[b];
    numel_of[b] += p.numel();
    buckets_[b].slots.push_back(j);
  }
  const bool zero = options_.zero() == 1;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& k = buckets_[b];
    const at::Tensor& p0 = slots_[k.slots.front()].param;
    // zero=1: padded with zeros to a multiple of the world size, one equal shard per rank.
    const int64_t numel = zero ? (numel_of[b] + world_ - 1) / world_ * world_ : numel_of[b];
    k.used = numel_of[b];
    k.flat = at::zeros({numel}, p0.options().requires_grad(false));
    if (wire_dtype_ != at::kFloat && p0.scalar_type() == at::kFloat) {
      k.wire = at::zeros({numel}, k.flat.options().dtype(wire_dtype_));
    }
    if (zero) {
      k.shard = at::zeros({numel / world_}, k.flat.options());
      if (k.wire.defined()) k.wire_shard = at::zeros({numel / world_}, k.wire.options());
      stats_.grad_shard_bytes += k.shard.nbytes();
    }
    k.pending = static_cast<int64_t>(k.slots.size());
    stats_.bucket_bytes += k.flat.nbytes();
  }
  stats_.buckets = static_cast<int64_t>(buckets_.size());
  at::NoGradGuard no_grad;
  for (Slot& s : slots_) {
    const at::Tensor& flat = buckets_[s.bucket].flat;
    const at::Tensor& p = s.param;
    {
      // Below the ADInplaceOrView key the views carry no autograd view metadata: to autograd a
      // grad is then a plain tensor sharing the bucket's memory, so torch::optim's C++
      // zero_grad (which calls detach_(), refused on views) and Python's both work on it.
      at::AutoDispatchBelowADInplaceOrView plain_views;
      if (p.is_non_overlapping_and_dense()) {  // the param's own layout (channels_last included)
        s.view = flat.as_strided(p.sizes(), p.strides(), s.offset);
      } else {
        s.view = flat.narrow(0, s.offset, p.numel()).view(p.sizes());
      }
    }
    // An existing gradient moves into the bucket; an undefined one stays undefined until the
    // first backward (as in a single process: find_unused_parameters relies on it).
    if (p.grad().defined()) adopt_grad(s);
  }
}

void Reducer::install_hooks() {
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    s.accumulator = torch::autograd::impl::grad_accumulator(s.param);
    TORCH_CHECK(s.accumulator, kName, ": could not get the gradient accumulator of a parameter");
    s.hook_key =
        s.accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [this, i](const torch::autograd::variable_list& outputs,
                      const torch::autograd::variable_list& /*inputs*/) {
              on_grad_ready(i);
              return outputs;
            }));
  }
}

// ---- backward -----------------------------------------------------------------------------------

void Reducer::adopt_grad(Slot& s) {
  at::Tensor& g = s.param.mutable_grad();
  if (g.defined() && g.unsafeGetTensorImpl() == s.view.unsafeGetTensorImpl()) return;
  if (g.defined())
    s.view.copy_(g);
  else
    s.view.zero_();
  g = s.view;
}

void Reducer::on_grad_ready(size_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = slots_[index];
  {
    at::NoGradGuard no_grad;
    adopt_grad(s);
  }
  s.used = true;
  const int task = torch::autograd::get_current_graph_task_id();
  if (!backward_active_) {
    backward_active_ = true;
    backward_task_ = task;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { end_backward(); });
  }
  // A gradient from another graph task while this backward runs: a reentrant backward (e.g.
  // torch.utils.checkpoint(use_reentrant=True)) would end the reduction too early.
  TORCH_CHECK(task == backward_task_, kName,
              ": a gradient arrived from a nested (reentrant) backward pass; "
              "torch.utils.checkpoint(..., use_reentrant=True) is not supported, use "
              "use_reentrant=False (torch's recommended form)");
  if (!armed_) return;
  TORCH_CHECK(!s.ready, kName, ": a parameter of shape ", s.param.sizes(),
              " was marked ready twice in one synchronising backward pass");
  s.ready = true;
  if (--buckets_[s.bucket].pending == 0) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    launch(next_launch_++);
  }
}

void Reducer::launch(size_t b) {
  Bucket& k = buckets_[b];
  if (t_first_launch_ == 0) t_first_launch_ = profile::now_ns();
  const double inv_world = 1.0 / static_cast<double>(world_);
  // One pass: divide by the world size and, when compressing, cast into the wire buffer.
  at::Tensor& wire = k.wire.defined() ? k.wire : k.flat;
  torchspeed::scale_cast_(wire, k.flat, inv_world);
  if (options_.zero() == 1 && !zero_by_all_reduce_) {
    at::Tensor& out = k.wire_shard.defined() ? k.wire_shard : k.shard;
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    k.work = group_->reduce_scatter_single(out, wire, opts);
  } else {
    std::vector<at::Tensor> tensors{wire};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    k.work = group_->allreduce(tensors, opts);
  }
  k.launched_during_backward = !finishing_;
  ++stats_.bucket_collectives;
  ++stats_.last_bucket_collectives;
  stats_.bytes_reduced += wire.nbytes();
  stats_.last_bytes_reduced += wire.nbytes();
}

void Reducer::fill_unready_slot(Slot& s) {
  // No gradient in this micro-step: the slot holds what earlier micro-steps accumulated (the grad
  // is the view), a gradient the user assigned (copied in), or nothing (zeroed).
  at::Tensor& g = s.param.mutable_grad();
  s.grad_was_undefined = !g.defined();
  at::NoGradGuard no_grad;
  if (s.grad_was_undefined) {
    s.view.zero_();
    // A param frozen since construction (requires_grad_(False)) keeps .grad None, as in a single
    // process: an optimizer then leaves it alone (a zero grad would still move it through weight
    // decay and momentum). Every rank must freeze the same params, as torch's DDP requires.
    if (!options_.find_unused_parameters() && s.param.requires_grad()) g = s.view;
  } else {
    adopt_grad(s);
  }
}

void Reducer::end_backward() {
  std::lock_guard<std::mutex> lock(mu_);
  backward_active_ = false;
  ++stats_.micro_steps;
  if (!armed_) {
    ++completed_;
    return;
  }
  try {
    finish_sync();
  } catch (...) {
    // A failed collective (a dead rank, the group's timeout): leave a clean state behind.
    recover_interrupted_backward();
    throw;
  }
}

void Reducer::finish_sync() {
  finishing_ = true;
  const int64_t t_backward_end = profile::now_ns();
  for (size_t b = next_launch_; b < buckets_.size(); ++b) {
    for (size_t i : buckets_[b].slots) {
      if (!slots_[i].ready) fill_unready_slot(slots_[i]);
    }
    launch(b);
  }
  next_launch_ = buckets_.size();
  {
    TORCHSPEED_PHASE("torchspeed.dist.wait", profile::Phase::Comm);
    for (Bucket& k : buckets_) {
      k.work->wait();
      k.work.reset();
      if (zero_by_all_reduce_) {  // this rank's slice of the all-reduced bucket
        const int64_t s = k.shard.numel();
        const at::Tensor& reduced = k.wire.defined() ? k.wire : k.flat;
        torchspeed::scale_cast_(k.shard, reduced.narrow(0, rank_ * s, s).contiguous(), 1.0);
      } else if (k.wire_shard.defined()) {
        torchspeed::scale_cast_(k.shard, k.wire_shard, 1.0);
      } else if (k.wire.defined() && options_.zero() == 0) {
        torchspeed::scale_cast_(k.flat, k.wire, 1.0);
      }
    }
    if (options_.find_unused_parameters()) vote_unused();
    if (options_.zero() == 1) agree_on_nonfinite();
  }
  const int64_t t_end = profile::now_ns();
  stats_.last_comm_ns = t_end - t_first_launch_;
  stats_.last_exposed_ns = t_end - t_backward_end;
  stats_.comm_ns += stats_.last_comm_ns;
  stats_.exposed_ns += stats_.last_exposed_ns;
  stats_.last_overlap =
      stats_.last_comm_ns > 0
          ? std::clamp(1.0 - static_cast<double>(stats_.last_exposed_ns) / stats_.last_comm_ns, 0.0,
                       1.0)
          : 0.0;
  stats_.last_buckets_overlapped = 0;
  for (const Bucket& k : buckets_) stats_.last_buckets_overlapped += k.launched_during_backward;
  ++stats_.sync_steps;
  ++optimizer_steps_;
  reset_window();
}

void Reducer::vote_unused() {
  // One int32 per slot, summed over ranks: 0 = no rank used the param in this window. Those whose
  // grad was undefined before the reducer zeroed the slot go back to undefined, as a single
  // process would leave them (every rank zeroes its grads the same way).
  at::Tensor used = at::zeros({static_cast<int64_t>(slots_.size())}, at::kInt);
  int32_t* u = used.data_ptr<int32_t>();
  for (size_t i = 0; i < slots_.size(); ++i) u[i] = slots_[i].used ? 1 : 0;
  std::vector<at::Tensor> tensors{used.to(control_device())};
  group_->allreduce(tensors)->wait();
  ++stats_.control_collectives;
  const at::Tensor total = tensors[0].cpu();
  const int32_t* t = total.data_ptr<int32_t>();
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.used || !s.grad_was_undefined) continue;
    if (t[i] == 0) {
      s.param.mutable_grad() = at::Tensor();
    } else {
      s.param.mutable_grad() = s.view;  // others used it: this rank's share was zero
    }
  }
}

void Reducer::agree_on_nonfinite() {
  std::vector<at::Tensor> shards;
  for (const Bucket& k : buckets_) shards.push_back(k.shard);
  at::Tensor flag = shards.empty() ? at::zeros({1}, at::kFloat)
                                   : torchspeed::grad_stats(shards).found_inf.reshape({1}).cpu();
  std::vector<at::Tensor> tensors{flag.to(control_device())};
  group_->allreduce(tensors)->wait();
  ++stats_.control_collectives;
  last_nonfinite_ = tensors[0].cpu().item<float>() != 0.0f;
  if (!last_nonfinite_) return;
  ++stats_.nonfinite_steps;
  at::NoGradGuard no_grad;
  // The first shard element that belongs to a param (padding is no optimizer's gradient): a
  // GradScaler looks at the params' gradients only. A rank that owns no param element of any
  // bucket marks its first non-empty shard's padding instead: ZeroShards::nonfinite_flag() hands
  // that element to the GradScaler, whose scale must change as on every other rank.
  Bucket* target = nullptr;
  for (Bucket& k : buckets_) {
    if (k.shard.numel() == 0) continue;
    if (target == nullptr) target = &k;
    if (rank_ * k.shard.numel() < k.used) {
      target = &k;
      break;
    }
  }
  if (target != nullptr) {
    target->shard.narrow(0, 0, 1).fill_(std::numeric_limits<double>::infinity());
  }
}

void Reducer::reset_window() {
  for (Slot& s : slots_) s.ready = false, s.used = false, s.grad_was_undefined = false;
  for (Bucket& k : buckets_) k.pending = static_cast<int64_t>(k.slots.size());
  next_launch_ = 0;
  t_first_launch_ = 0;
  completed_ = 0;
  armed_ = false;
  finishing_ = false;
}

void Reducer::recover_interrupted_backward() {
  // A backward raised before its end callback ran: drain what was launched and start over. (If
  // other ranks did not fail the same way, their collectives fail with the group's timeout.)
  for (Bucket& k : buckets_) {
    if (!k.work) continue;
    try {
      k.work->wait();
    } catch (...) {
    }
    k.work.reset();
  }
  backward_active_ = false;
  reset_window();
}

// ---- micro-steps
// ----------------------------------------------------------------------------------

bool Reducer::begin_micro_step(bool allow_sync) {
  std::lock_guard<std::mutex> lock(mu_);
  if (backward_active_) recover_interrupted_backward();
  sync_ = allow_sync && completed_ + 1 >= options_.accumulation_steps();
  armed_ = sync_;
  stats_.last_bucket_collectives = 0;
  if (sync_) {
    stats_.last_bytes_reduced = 0;
    if (join_active_) control(true, 0.0);
    if (options_.broadcast_buffers() && !buffers_.empty()) broadcast_buffers();
  }
  return sync_;
}

bool Reducer::sync_now() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sync_;
}

int64_t Reducer::micro_step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_;
}

void Reducer::zero_grad() {
  std::lock_guard<std::mutex> lock(mu_);
  at::NoGradGuard no_grad;
  for (Bucket& k : buckets_) k.flat.zero_();
  for (Slot& s : slots_) s.param.mutable_grad() = s.view;
}

at::Tensor Reducer::clip_grad_norm_(double max_norm) {
  // As torch.nn.utils.clip_grad_norm_: 0 zeroes the gradients, inf only measures the norm. A
  // negative max_norm (which torch turns into a sign flip) or NaN is refused.
  TORCH_CHECK_VALUE(max_norm >= 0, kName, ".clip_grad_norm_: max_norm must be >= 0, got ",
                    max_norm);
  std::lock_guard<std::mutex> lock(mu_);
  if (options_.zero() == 1) return clip_shards(max_norm);
  std::vector<at::Tensor> flats;
  for (const Bucket& k : buckets_) flats.push_back(k.flat);
  if (flats.empty()) return at::zeros({}, at::kFloat);
  // grad_stats: one read of every bucket in fixed order, so every rank gets the same norm.
  const at::Tensor total = torchspeed::grad_stats(flats).total_norm;
  const at::Tensor coef = at::clamp_max(max_norm / (total + 1e-6), 1.0);
  at::NoGradGuard no_grad;
  for (at::Tensor& f : flats) f.mul_(coef.to(f.scalar_type()));
  return total;
}

at::Tensor Reducer::clip_shards(double max_norm) {
  // The sum of squares of this rank's shards in float64, summed over the ranks: the global norm
  // of the reduced gradient, the same on every rank (as torch.nn.utils.clip_grad_norm_ computes
  // it, up to the order of the sum).
  at::Tensor sum_sq = at::zeros({1}, at::kDouble);
  for (const Bucket& k : buckets_) {
    if (k.shard.numel() == 0) continue;
    sum_sq += at::linalg_vector_norm(k.shard, 2, c10::nullopt, false, at::kDouble).square().cpu();
  }
  std::vector<at::Tensor> tensors{sum_sq.to(control_device())};
  group_->allreduce(tensors)->wait();
  ++stats_.control_collectives;
  const double total = std::sqrt(tensors[0].cpu().item<double>());
  const double coef = std::min(max_norm / (total + 1e-6), 1.0);
  at::NoGradGuard no_grad;
  if (coef < 1.0 || std::isnan(coef)) {
    for (Bucket& k : buckets_) k.shard.mul_(coef);
  }
  return at::full({}, total, at::kFloat);
}

// ---- control collectives ------------------------------------------------------------------------

at::Device Reducer::control_device() const {
  if (!buckets_.empty()) return buckets_.front().flat.device();
  if (!all_params_.empty()) return all_params_.front().device();
  return at::kCPU;
}

double Reducer::control(bool present, double payload) {
  // [presence of each rank..., payload]: a rank that has joined contributes zeros.
  at::Tensor v = at::zeros({world_ + 1}, at::kDouble);
  double* p = v.data_ptr<double>();
  if (present) p[rank_] = 1.0, p[world_] = payload;
  std::vector<at::Tensor> tensors{v.to(control_device())};
  group_->allreduce(tensors)->wait();
  ++stats_.control_collectives;
  const at::Tensor sum = tensors[0].cpu();
  const double* s = sum.data_ptr<double>();
  if (join_active_ && present) {
    std::vector<int64_t> missing;
    for (int64_t r = 0; r < world_; ++r) {
      if (s[r] == 0.0) missing.push_back(r);
    }
    if (!missing.empty()) {
      join_active_ = false;
      std::ostringstream msg;
      msg << kName << ": rank" << (missing.size() > 1 ? "s " : " ");
      for (size_t i = 0; i < missing.size(); ++i) msg << (i ? ", " : "") << missing[i];
      msg << " ran out of data before optimizer step " << optimizer_steps_ + 1 << " (rank " << rank_
          << " of " << world_ << " still had data); every rank still training stops here. "
          << "Give every rank the same number of batches (drop_last, a DistributedSampler) to "
             "train to the end.";
      throw RanksOutOfData(msg.str(), std::move(missing));
    }
  }
  return s[world_];
}

void Reducer::join_begin() {
  std::lock_guard<std::mutex> lock(mu_);
  join_active_ = true;
}

void Reducer::join() {
  std::lock_guard<std::mutex> lock(mu_);
  TORCH_CHECK(join_active_, kName, ".join: call join_begin() before the training loop");
  // One control all-reduce as an absent rank: matched by the others' next check, which either
  // finds every rank absent (all done together) or finds this one missing (they stop).
  control(false, 0.0);
  join_active_ = false;
}

double Reducer::all_reduce_count(double value) {
  std::lock_guard<std::mutex> lock(mu_);
  TORCH_CHECK_VALUE(std::isfinite(value), kName, ".all_reduce_count: value must be finite, got ",
                    value);
  return control(true, value);
}

void Reducer::broadcast_tensors(const std::vector<at::Tensor>& tensors) {
  // One broadcast per (device, dtype) group: flattened, broadcast, copied back.
  std::map<std::tuple<int, int, int>, std::vector<at::Tensor>> groups;
  for (const at::Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    groups[{static_cast<int>(t.device().type()), t.device().index(),
            static_cast<int>(t.scalar_type())}]
        .push_back(t);
  }
  at::NoGradGuard no_grad;
  for (auto& [key, list] : groups) {
    std::vector<at::Tensor> flat_list{at::flatten_dense_tensors(list)};
    c10d::BroadcastOptions opts;
    opts.rootRank = 0;
    group_->broadcast(flat_list, opts)->wait();
    ++stats_.control_collectives;
    if (rank_ == 0) continue;
    const auto parts = at::unflatten_dense_tensors(flat_list[0], list);
    for (size_t i = 0; i < list.size(); ++i) list[i].copy_(parts[i]);
  }
}

void Reducer::broadcast_buffers() { broadcast_tensors(buffers_); }

void Reducer::broadcast_from_rank0() {
  std::lock_guard<std::mutex> lock(mu_);
  broadcast_all_from_rank0();
}

void Reducer::broadcast_all_from_rank0() {
  std::vector<at::Tensor> all = all_params_;
  all.insert(all.end(), buffers_.begin(), buffers_.end());
  broadcast_tensors(all);
}

// ---- introspection ------------------------------------------------------------------------------

DDPStats Reducer::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::vector<at::Tensor> Reducer::buckets() const {
  std::vector<at::Tensor> out;
  for (const Bucket& k : buckets_) out.push_back(k.flat);
  return out;
}

std::vector<at::Tensor> Reducer::grad_shards() const {
  std::vector<at::Tensor> out;
  for (const Bucket& k : buckets_) {
    if (k.shard.defined()) out.push_back(k.shard);
  }
  return out;
}

std::string Reducer::zero_collectives() const {
  if (options_.zero() == 0) return "";
  return zero_by_all_reduce_ ? "all_reduce" : "reduce_scatter";
}

bool Reducer::last_nonfinite() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_nonfinite_;
}

std::vector<std::pair<int64_t, int64_t>> Reducer::param_slots() const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const Slot& s : slots_) out.emplace_back(s.bucket, s.offset);
  return out;
}

std::vector<at::Tensor> Reducer::slot_params() const {
  std::vector<at::Tensor> out;
  for (const Slot& s : slots_) out.push_back(s.param);
  return out;
}

// ---- the public class
// -----------------------------------------------------------------------------

namespace {
std::vector<at::Tensor> module_buffers(const torch::nn::Module& m) { return m.buffers(true); }
}  // namespace

AccumulatingDDP::AccumulatingDDP(std::vector<at::Tensor> params, std::vector<at::Tensor> buffers,
                                 c10::intrusive_ptr<c10d::ProcessGroup> group, DDPOptions options,
                                 std::vector<std::string> param_names,
                                 std::vector<std::string> buffer_names)
    : reducer_(std::make_unique<Reducer>(std::move(params), std::move(buffers), std::move(group),
                                         std::move(options), std::move(param_names),
                                         std::move(buffer_names))) {}

AccumulatingDDP::AccumulatingDDP(const torch::nn::Module& module,
                                 c10::intrusive_ptr<c10d::ProcessGroup> group, DDPOptions options)
    : AccumulatingDDP(module.parameters(true), module_buffers(module), std::move(group),
                      std::move(options), module.named_parameters(true).keys(),
                      module.named_buffers(true).keys()) {}

AccumulatingDDP::~AccumulatingDDP() = default;

bool AccumulatingDDP::begin_micro_step(bool allow_sync) {
  return reducer_->begin_micro_step(allow_sync);
}
bool AccumulatingDDP::sync_now() const { return reducer_->sync_now(); }
int64_t AccumulatingDDP::micro_step() const { return reducer_->micro_step(); }
void AccumulatingDDP::zero_grad() { reducer_->zero_grad(); }
at::Tensor AccumulatingDDP::clip_grad_norm_(double max_norm) {
  return reducer_->clip_grad_norm_(max_norm);
}
void AccumulatingDDP::join_begin() { reducer_->join_begin(); }
void AccumulatingDDP::join() { reducer_->join(); }
double AccumulatingDDP::all_reduce_count(double value) { return reducer_->all_reduce_count(value); }
void AccumulatingDDP::broadcast_from_rank0() { reducer_->broadcast_from_rank0(); }
int64_t AccumulatingDDP::rank() const { return reducer_->rank(); }
int64_t AccumulatingDDP::world_size() const { return reducer_->world_size(); }
const DDPOptions& AccumulatingDDP::options() const { return reducer_->options(); }
DDPStats AccumulatingDDP::stats() const { return reducer_->stats(); }
std::vector<at::Tensor> AccumulatingDDP::buckets() const { return reducer_->buckets(); }
std::vector<at::Tensor> AccumulatingDDP::grad_shards() const { return reducer_->grad_shards(); }
bool AccumulatingDDP::last_nonfinite() const { return reducer_->last_nonfinite(); }
std::string AccumulatingDDP::zero_collectives() const { return reducer_->zero_collectives(); }
std::vector<std::pair<int64_t, int64_t>> AccumulatingDDP::param_slots() const {
  return reducer_->param_slots();
}
std::vector<at::Tensor> AccumulatingDDP::slot_params() const { return reducer_->slot_params(); }
const c10::intrusive_ptr<c10d::ProcessGroup>& AccumulatingDDP::process_group() const {
  return reducer_->group();
}

}  // namespace torchspeed::dist
