// torchspeed::optim::{Adam, AdamW, SGD, Lion, LAMB}: torch::optim::Optimizer subclasses whose step
// calls the fused torchspeed::*_step_ ops through the dispatcher (CPU or CUDA by the params'
// device).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/serialize/archive.h>
#include <torch/utils.h>

#include <set>
#include <string>
#include <string_view>

#include "torchspeed/ops.h"
#include "torchspeed/optim/adam.h"
#include "torchspeed/optim/lion.h"
#include "torchspeed/optim/sgd.h"

namespace torchspeed::optim {

// The fields of each options and state class, listed once. Every per-field function (==, save,
// load, param-group merge) is generated from these lists: PLAIN(type, name) is an ordinary
// field, OPT(type, name) a std::optional one, and TENSOR(name) a state tensor.
// clang-format off
#define TORCHSPEED_ADAM_FIELDS(PLAIN, OPT)                                                  \
  PLAIN(double, lr) PLAIN(betas_t, betas) PLAIN(double, eps) PLAIN(double, weight_decay)    \
  PLAIN(bool, amsgrad) PLAIN(bool, maximize) PLAIN(bool, decoupled_weight_decay)            \
  OPT(bool, master_weights) OPT(double, max_grad_norm)
#define TORCHSPEED_ADAMW_FIELDS(PLAIN, OPT)                                                 \
  PLAIN(double, lr) PLAIN(betas_t, betas) PLAIN(double, eps) PLAIN(double, weight_decay)    \
  PLAIN(bool, amsgrad) PLAIN(bool, maximize)                                                \
  OPT(bool, master_weights) OPT(double, max_grad_norm)
#define TORCHSPEED_SGD_FIELDS(PLAIN, OPT)                                                   \
  PLAIN(double, lr) PLAIN(double, momentum) PLAIN(double, dampening)                        \
  PLAIN(double, weight_decay) PLAIN(bool, nesterov) PLAIN(bool, maximize)                   \
  OPT(bool, master_weights) OPT(double, max_grad_norm)
#define TORCHSPEED_LION_FIELDS(PLAIN, OPT)                                                  \
  PLAIN(double, lr) PLAIN(betas_t, betas) PLAIN(double, weight_decay) PLAIN(bool, maximize) \
  OPT(bool, master_weights) OPT(double, max_grad_norm)
#define TORCHSPEED_LAMB_FIELDS(PLAIN, OPT)                                                  \
  PLAIN(double, lr) PLAIN(betas_t, betas) PLAIN(double, eps) PLAIN(double, weight_decay)    \
  PLAIN(bool, maximize)                                                                     \
  OPT(bool, master_weights) OPT(double, max_grad_norm)
#define TORCHSPEED_ADAM_STATE(TENSOR) \
  TENSOR(step) TENSOR(exp_avg) TENSOR(exp_avg_sq) TENSOR(max_exp_avg_sq) TENSOR(master)
#define TORCHSPEED_SGD_STATE(TENSOR) TENSOR(momentum_buffer) TENSOR(master)
#define TORCHSPEED_LION_STATE(TENSOR) TENSOR(step) TENSOR(exp_avg) TENSOR(master)
#define TORCHSPEED_LAMB_STATE(TENSOR) TENSOR(step) TENSOR(exp_avg) TENSOR(exp_avg_sq) TENSOR(master)
// clang-format on

namespace {

using torch::optim::Optimizer;
using torch::optim::OptimizerParamState;
using OptTensor = std::optional<at::Tensor>;

bool is_supported_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

bool wants_master(const std::optional<bool>& master_weights, const at::Tensor& p) {
  return (p.scalar_type() == at::kBFloat16 || p.scalar_type() == at::kHalf) &&
         master_weights.value_or(true);
}

void check_betas(const char* name, const std::tuple<double, double>& betas) {
  const double b[2] = {std::get<0>(betas), std::get<1>(betas)};
  for (int i = 0; i < 2; ++i) {
    TORCH_CHECK(0.0 <= b[i] && b[i] < 1.0, "torchspeed.optim.", name, ": betas[", i,
                "] must be in [0, 1), got ", b[i]);
  }
}

void check_common_options(const char* name, double lr, double weight_decay,
                          const std::optional<double>& max_grad_norm) {
  TORCH_CHECK(lr >= 0, "torchspeed.optim.", name, ": lr must be >= 0, got ", lr);
  TORCH_CHECK(weight_decay >= 0, "torchspeed.optim.", name, ": weight_decay must be >= 0, got ",
              weight_decay);
  TORCH_CHECK(!max_grad_norm || *max_grad_norm > 0, "torchspeed.optim.", name,
              ": max_grad_norm must be > 0 or unset, got ", max_grad_norm.value_or(0));
}

// Every param the optimizer holds must be a dense float32/bfloat16/float16 tensor; checked at
// construction so a bad model fails early with the param's position.
void check_params(const char* name, const Optimizer& self) {
  const auto& groups = self.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      TORCH_CHECK(p.defined() && p.layout() == at::kStrided && is_supported_dtype(p.scalar_type()),
                  "torchspeed.optim.", name, ": param_groups[", g, "].params[", i,
                  "] must be a dense float32, bfloat16 or float16 tensor, got ",
                  p.defined() ? c10::str(p.scalar_type(), " ", p.layout()) : std::string("None"));
    }
  }
}

// Validates every param that has a grad before anything (state included) is created or changed,
// so a bad step throws and leaves the optimizer and the model as they were.
void check_step_inputs(const char* name, const Optimizer& self) {
  const auto& groups = self.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) continue;
      const auto where = c10::str("param_groups[", g, "].params[", i, "]");
      TORCH_CHECK(p.layout() == at::kStrided && is_supported_dtype(p.scalar_type()),
                  "torchspeed.optim.", name, ": ", where,
                  " must be a dense float32, bfloat16 or float16 tensor, got ", p.scalar_type(),
                  " ", p.layout());
      TORCH_CHECK(p.is_contiguous(), "torchspeed.optim.", name, ": ", where,
                  " must be contiguous, got strides ", p.strides());
      TORCH_CHECK(grad.layout() == at::kStrided, "torchspeed.optim.", name, ": the grad of ", where,
                  " must be dense; sparse gradients are not supported, got ", grad.layout());
      TORCH_CHECK(is_supported_dtype(grad.scalar_type()), "torchspeed.optim.", name,
                  ": the grad of ", where, " must be float32, bfloat16 or float16, got ",
                  grad.scalar_type());
      TORCH_CHECK(grad.device() == p.device() && grad.sizes() == p.sizes(), "torchspeed.optim.",
                  name, ": the grad of ", where, " must have the param's shape ", p.sizes(),
                  " and device ", p.device(), ", got ", grad.sizes(), " on ", grad.device());
    }
  }
}

// Global-norm clipping as torch.nn.utils.clip_grad_norm_, computed on the device by grad_stats;
// the kernels multiply the grads by the returned one-element coefficient.
template <typename Options>
OptTensor clip_coef(const char* name, const Optimizer& self) {
  std::set<double> max_norms;
  std::vector<at::Tensor> grads;
  for (const auto& group : self.param_groups()) {
    const auto& options = static_cast<const Options&>(group.options());
    if (options.max_grad_norm()) max_norms.insert(*options.max_grad_norm());
    for (const auto& p : group.params()) {
      if (p.grad().defined()) grads.push_back(p.grad());
    }
  }
  if (max_norms.empty() || grads.empty()) return std::nullopt;
  TORCH_CHECK(max_norms.size() == 1, "torchspeed.optim.", name,
              ": max_grad_norm clips the global norm and must be the same in every param group "
              "that sets it, got ",
              std::vector<double>(max_norms.begin(), max_norms.end()));
  const at::Tensor norm = torchspeed::grad_stats(grads).total_norm;
  return at::clamp_max(*max_norms.begin() / (norm + 1e-6), 1.0).reshape({1});
}

at::Tensor fp32_zeros_like(const at::Tensor& p) {
  return at::zeros(p.sizes(), p.options().dtype(at::kFloat));
}

// Splits the params with a grad into (wants a master) / (does not) buckets, non-empty only.
std::vector<std::vector<at::Tensor>> master_buckets(const std::vector<at::Tensor>& params,
                                                    const std::optional<bool>& master_weights) {
  std::vector<at::Tensor> with, without;
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    (wants_master(master_weights, p) ? with : without).push_back(p);
  }
  std::vector<std::vector<at::Tensor>> out;
  for (auto* b : {&with, &without}) {
    if (!b->empty()) out.push_back(std::move(*b));
  }
  return out;
}

// State loaded from an archive may sit on another device or (step) have another shape.
void place_on(at::Tensor& t, const at::Tensor& p, bool scalar = false) {
  if (!t.defined()) return;
  if (t.device() != p.device() || t.scalar_type() != at::kFloat) {
    t = t.to(p.device(), at::kFloat).contiguous();
  }
  if (scalar && t.dim() != 0) t = t.reshape({});
}

// State loaded from an archive: every tensor on the param's device in float32, `step` 0-dim.
#define TORCHSPEED_PLACE_TENSOR(name) place_on(s.name(), p, std::string_view(#name) == "step");
#define TORCHSPEED_PLACE_STATE(State, TENSORS) \
  void place_state(State& s, const at::Tensor& p) { TENSORS(TORCHSPEED_PLACE_TENSOR) }
TORCHSPEED_PLACE_STATE(AdamParamState, TORCHSPEED_ADAM_STATE)
TORCHSPEED_PLACE_STATE(SGDParamState, TORCHSPEED_SGD_STATE)
TORCHSPEED_PLACE_STATE(LionParamState, TORCHSPEED_LION_STATE)
TORCHSPEED_PLACE_STATE(LAMBParamState, TORCHSPEED_LAMB_STATE)
#undef TORCHSPEED_PLACE_STATE
#undef TORCHSPEED_PLACE_TENSOR

// The state of `p`, created by `init` the first time and placed with place_state, with the
// fp32 master rebuilt from the param when the optimizer wants one and (e.g. after a load from an
// archive saved without masters) there is none.
template <class State, class Init>
State& state_of(Optimizer& self, const at::Tensor& p, bool master, Init&& init) {
  auto& states = self.state();
  auto it = states.find(p.unsafeGetTensorImpl());
  if (it == states.end()) {
    auto fresh = std::make_unique<State>();
    init(*fresh);
    it = states.emplace(p.unsafeGetTensorImpl(), std::move(fresh)).first;
  }
  auto& s = static_cast<State&>(*it->second);
  place_state(s, p);
  if (master && !s.master().defined()) s.master(p.detach().to(at::kFloat).clone());
  return s;
}

at::Tensor zero_step(const at::Tensor& p) { return at::zeros({}, p.options().dtype(at::kFloat)); }

// Everything a step does around its op calls: no grad, the closure, every input checked before
// anything changes, the global clip coefficient; then body(options, bucket, clip_coef) for each
// (param group, master/no-master bucket).
template <typename Options, typename Body>
at::Tensor fused_step(Optimizer& self, const char* name, const Optimizer::LossClosure& closure,
                      Body&& body) {
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  check_step_inputs(name, self);
  const OptTensor coef = clip_coef<Options>(name, self);
  for (auto& group : self.param_groups()) {
    const auto& o = static_cast<const Options&>(group.options());
    for (const auto& bucket : master_buckets(group.params(), o.master_weights())) {
      body(o, bucket, coef);
    }
  }
  return loss;
}

at::Tensor contiguous_grad(const at::Tensor& p) {
  const at::Tensor& g = p.grad();
  return g.is_contiguous() ? g : g.contiguous();
}

// ---- Adam / AdamW -------------------------------------------------------------------------------
bool decoupled(const AdamOptions& o) { return o.decoupled_weight_decay(); }
bool decoupled(const AdamWOptions&) { return true; }

template <typename Options>
at::Tensor adam_family_step(Optimizer& self, const char* name,
                            const Optimizer::LossClosure& closure) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("torchspeed::adam_step_", "")
                       .typed<void(at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                                   at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                                   at::TensorList, double, double, double, double, double, bool,
                                   bool, bool, const OptTensor&, const OptTensor&, const OptTensor&,
                                   const OptTensor&, double)>();
  return fused_step<Options>(
      self, name, closure, [&](const Options& o, const auto& bucket, const OptTensor& coef) {
        std::vector<at::Tensor> grads, exp_avgs, exp_avg_sqs, max_sqs, masters, steps;
        for (const auto& p : bucket) {
          const bool master = wants_master(o.master_weights(), p);
          auto& s = state_of<AdamParamState>(self, p, master, [&](AdamParamState& fresh) {
            fresh.step(zero_step(p));
            fresh.exp_avg(fp32_zeros_like(p));
            fresh.exp_avg_sq(fp32_zeros_like(p));
          });
          if (o.amsgrad() && !s.max_exp_avg_sq().defined()) s.max_exp_avg_sq(fp32_zeros_like(p));
          grads.push_back(contiguous_grad(p));
          exp_avgs.push_back(s.exp_avg());
          exp_avg_sqs.push_back(s.exp_avg_sq());
          if (o.amsgrad()) max_sqs.push_back(s.max_exp_avg_sq());
          if (master) masters.push_back(s.master());
          steps.push_back(s.step());
        }
        op.call(bucket, grads, exp_avgs, exp_avg_sqs, max_sqs, masters, steps, {}, {}, o.lr(),
                std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(),
                o.amsgrad(), o.maximize(), decoupled(o), std::nullopt, std::nullopt, std::nullopt,
                coef, 0.0);
      });
}

template <typename Options>
void check_adam_options(const char* name, const Options& o) {
  check_common_options(name, o.lr(), o.weight_decay(), o.max_grad_norm());
  TORCH_CHECK(o.eps() >= 0, "torchspeed.optim.", name, ": eps must be >= 0, got ", o.eps());
  check_betas(name, o.betas());
}

// ---- SGD ----------------------------------------------------------------------------------------
bool has_buffer(const Optimizer& self, const at::Tensor& p) {
  auto it = self.state().find(p.unsafeGetTensorImpl());
  return it != self.state().end() &&
         static_cast<const SGDParamState&>(*it->second).momentum_buffer().defined();
}

// ---- Lion / LAMB -------------------------------------------------------------------------------
template <typename Options>
void check_lion_family_options(const char* name, const Options& o) {
  check_common_options(name, o.lr(), o.weight_decay(), o.max_grad_norm());
  check_betas(name, o.betas());
}

// torch::optim::Optimizer::add_param_group merges a group's own options with the defaults only
// for torch's option types and otherwise replaces them by the defaults. This restores them with
// torch's rule: a field left at its constructor default inherits the optimizer's default.
#define TORCHSPEED_INHERIT_FIELD(type, name) \
  if (user.name() == fresh.name()) merged.name(defaults.name());
#define TORCHSPEED_DEFINE_MERGE(Options, FIELDS)                        \
  Options merge_options(const Options& user, const Options& defaults) { \
    const Options fresh;                                                \
    Options merged = user;                                              \
    FIELDS(TORCHSPEED_INHERIT_FIELD, TORCHSPEED_INHERIT_FIELD)          \
    return merged;                                                      \
  }
TORCHSPEED_DEFINE_MERGE(AdamOptions, TORCHSPEED_ADAM_FIELDS)
TORCHSPEED_DEFINE_MERGE(AdamWOptions, TORCHSPEED_ADAMW_FIELDS)
TORCHSPEED_DEFINE_MERGE(LionOptions, TORCHSPEED_LION_FIELDS)
TORCHSPEED_DEFINE_MERGE(LAMBOptions, TORCHSPEED_LAMB_FIELDS)

SGDOptions merge_options(const SGDOptions& user, const SGDOptions& defaults) {
  const SGDOptions fresh(user.lr());
  SGDOptions merged = user;
  TORCHSPEED_SGD_FIELDS(TORCHSPEED_INHERIT_FIELD, TORCHSPEED_INHERIT_FIELD)
  merged.lr(user.lr());  // SGDOptions has no default lr: a group's lr is always its own.
  return merged;
}
#undef TORCHSPEED_DEFINE_MERGE
#undef TORCHSPEED_INHERIT_FIELD

template <typename Options>
void restore_group_options(const char* name, Optimizer& self,
                           const std::vector<torch::optim::OptimizerParamGroup>& groups,
                           const Options& defaults) {
  TORCH_INTERNAL_ASSERT(self.param_groups().size() == groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    if (!groups[i].has_options()) continue;
    const auto* user = dynamic_cast<const Options*>(&groups[i].options());
    TORCH_CHECK(user != nullptr, "torchspeed.optim.", name, ": param_groups[", i,
                "] must carry torchspeed::optim::", name, "Options, got another options type");
    self.param_groups()[i].set_options(std::make_unique<Options>(merge_options(*user, defaults)));
  }
}

// Optimizer::add_param_group, then the group's own options restored as in the constructor.
template <typename Options>
void add_group(const char* name, Optimizer& self, const torch::optim::OptimizerParamGroup& group) {
  if (group.has_options()) {
    TORCH_CHECK(dynamic_cast<const Options*>(&group.options()) != nullptr, "torchspeed.optim.",
                name, ": the param group must carry torchspeed::optim::", name,
                "Options, got another options type");
  }
  self.Optimizer::add_param_group(group);
  if (group.has_options()) {
    const auto& user = static_cast<const Options&>(group.options());
    const auto& defaults = static_cast<const Options&>(self.defaults());
    self.param_groups().back().set_options(
        std::make_unique<Options>(merge_options(user, defaults)));
  }
  check_params(name, self);
}

}  // namespace

// ---- options and state: constructors, accessors, (de)serialization ------------------------------

#define TORCHSPEED_EQ_FIELD(type, name) &&lhs.name() == rhs.name()
#define TORCHSPEED_SAVE_FIELD(type, name) _TORCH_OPTIM_SERIALIZE_TORCH_ARG(name)
#define TORCHSPEED_LOAD_FIELD(type, name) _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(type, name)
#define TORCHSPEED_LOAD_OPT_FIELD(type, name) \
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG_OPTIONAL(type, name)
#define TORCHSPEED_DEFINE_OPTIONS(Options, FIELDS)                          \
  Options::Options(double lr) : lr_(lr) {}                                  \
  double Options::get_lr() const { return lr(); }                           \
  void Options::set_lr(const double lr) { this->lr(lr); }                   \
  bool operator==(const Options& lhs, const Options& rhs) {                 \
    return true FIELDS(TORCHSPEED_EQ_FIELD, TORCHSPEED_EQ_FIELD);           \
  }                                                                         \
  void Options::serialize(torch::serialize::OutputArchive& archive) const { \
    FIELDS(TORCHSPEED_SAVE_FIELD, TORCHSPEED_SAVE_FIELD)                    \
  }                                                                         \
  void Options::serialize(torch::serialize::InputArchive& archive) {        \
    FIELDS(TORCHSPEED_LOAD_FIELD, TORCHSPEED_LOAD_OPT_FIELD)                \
  }
TORCHSPEED_DEFINE_OPTIONS(AdamOptions, TORCHSPEED_ADAM_FIELDS)
TORCHSPEED_DEFINE_OPTIONS(AdamWOptions, TORCHSPEED_ADAMW_FIELDS)
TORCHSPEED_DEFINE_OPTIONS(SGDOptions, TORCHSPEED_SGD_FIELDS)
TORCHSPEED_DEFINE_OPTIONS(LionOptions, TORCHSPEED_LION_FIELDS)
TORCHSPEED_DEFINE_OPTIONS(LAMBOptions, TORCHSPEED_LAMB_FIELDS)

// State tensors: an undefined tensor (e.g. no master) is not written, and stays undefined on load.
#define TORCHSPEED_SAVE_TENSOR(name) _TORCH_OPTIM_SERIALIZE_TORCH_ARG(name)
#define TORCHSPEED_LOAD_TENSOR(name) _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, name)
#define TORCHSPEED_DEFINE_STATE(State, TENSORS)                           \
  void State::serialize(torch::serialize::OutputArchive& archive) const { \
    TENSORS(TORCHSPEED_SAVE_TENSOR)                                       \
  }                                                                       \
  void State::serialize(torch::serialize::InputArchive& archive) { TENSORS(TORCHSPEED_LOAD_TENSOR) }
TORCHSPEED_DEFINE_STATE(AdamParamState, TORCHSPEED_ADAM_STATE)
TORCHSPEED_DEFINE_STATE(SGDParamState, TORCHSPEED_SGD_STATE)
TORCHSPEED_DEFINE_STATE(LionParamState, TORCHSPEED_LION_STATE)
TORCHSPEED_DEFINE_STATE(LAMBParamState, TORCHSPEED_LAMB_STATE)

// ---- optimizers ---------------------------------------------------------------------------------

Adam::Adam(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, AdamOptions defaults)
    : Optimizer(param_groups, std::make_unique<AdamOptions>(defaults)) {
  restore_group_options("Adam", *this, param_groups, defaults);
  check_adam_options("Adam", defaults);
  check_params("Adam", *this);
}

torch::Tensor Adam::step(LossClosure closure) {
  return adam_family_step<AdamOptions>(*this, "Adam", closure);
}

AdamW::AdamW(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
             AdamWOptions defaults)
    : Optimizer(param_groups, std::make_unique<AdamWOptions>(defaults)) {
  restore_group_options("AdamW", *this, param_groups, defaults);
  check_adam_options("AdamW", defaults);
  check_params("AdamW", *this);
}

torch::Tensor AdamW::step(LossClosure closure) {
  return adam_family_step<AdamWOptions>(*this, "AdamW", closure);
}

SGD::SGD(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, SGDOptions defaults)
    : Optimizer(param_groups, std::make_unique<SGDOptions>(defaults)) {
  restore_group_options("SGD", *this, param_groups, defaults);
  check_common_options("SGD", defaults.lr(), defaults.weight_decay(), defaults.max_grad_norm());
  TORCH_CHECK(defaults.momentum() >= 0, "torchspeed.optim.SGD: momentum must be >= 0, got ",
              defaults.momentum());
  TORCH_CHECK(!defaults.nesterov() || (defaults.momentum() > 0 && defaults.dampening() == 0),
              "torchspeed.optim.SGD: nesterov requires a momentum and zero dampening, got "
              "momentum ",
              defaults.momentum(), " and dampening ", defaults.dampening());
  check_params("SGD", *this);
}

torch::Tensor SGD::step(LossClosure closure) {
  for (size_t g = 0; g < param_groups().size(); ++g) {
    const auto& o = static_cast<const SGDOptions&>(param_groups()[g].options());
    TORCH_CHECK(!o.nesterov() || o.momentum() == 0 || o.dampening() == 0,
                "torchspeed.optim.SGD: nesterov requires zero dampening, got dampening ",
                o.dampening(), " in param_groups[", g, "]");
  }
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("torchspeed::sgd_step_", "")
                       .typed<void(at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                                   at::TensorList, at::TensorList, double, double, double, double,
                                   bool, bool, bool, const OptTensor&, const OptTensor&,
                                   const OptTensor&, const OptTensor&, double)>();
  return fused_step<SGDOptions>(
      *this, "SGD", closure,
      [&](const SGDOptions& o, const auto& by_master, const OptTensor& coef) {
        const bool with_momentum = o.momentum() != 0;
        // Params without a momentum buffer yet start it from their grad (first_step = true).
        std::vector<std::vector<at::Tensor>> buckets;
        if (with_momentum) {
          std::vector<at::Tensor> fresh, old;
          for (const auto& p : by_master) (has_buffer(*this, p) ? old : fresh).push_back(p);
          for (auto* b : {&fresh, &old}) {
            if (!b->empty()) buckets.push_back(std::move(*b));
          }
        } else {
          buckets.push_back(by_master);
        }
        for (const auto& bucket : buckets) {
          const bool first_step = with_momentum && !has_buffer(*this, bucket[0]);
          std::vector<at::Tensor> grads, buffers, masters;
          for (const auto& p : bucket) {
            const bool master = wants_master(o.master_weights(), p);
            auto& s = state_of<SGDParamState>(*this, p, master, [](SGDParamState&) {});
            grads.push_back(contiguous_grad(p));
            if (with_momentum) {
              if (!s.momentum_buffer().defined()) s.momentum_buffer(fp32_zeros_like(p));
              buffers.push_back(s.momentum_buffer());
            }
            if (master) masters.push_back(s.master());
          }
          op.call(bucket, grads, buffers, masters, {}, {}, o.lr(), o.momentum(), o.dampening(),
                  o.weight_decay(), o.nesterov() && with_momentum, o.maximize(), first_step,
                  std::nullopt, std::nullopt, std::nullopt, coef, 0.0);
        }
      });
}

Lion::Lion(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, LionOptions defaults)
    : Optimizer(param_groups, std::make_unique<LionOptions>(defaults)) {
  restore_group_options("Lion", *this, param_groups, defaults);
  check_lion_family_options("Lion", defaults);
  check_params("Lion", *this);
}

torch::Tensor Lion::step(LossClosure closure) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("torchspeed::lion_step_", "")
                       .typed<void(at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                                   at::TensorList, at::TensorList, at::TensorList, double, double,
                                   double, double, bool, const OptTensor&, const OptTensor&,
                                   const OptTensor&, const OptTensor&, double)>();
  return fused_step<LionOptions>(
      *this, "Lion", closure, [&](const LionOptions& o, const auto& bucket, const OptTensor& coef) {
        std::vector<at::Tensor> grads, exp_avgs, masters, steps;
        for (const auto& p : bucket) {
          const bool master = wants_master(o.master_weights(), p);
          auto& s = state_of<LionParamState>(*this, p, master, [&](LionParamState& fresh) {
            fresh.step(zero_step(p));
            fresh.exp_avg(fp32_zeros_like(p));
          });
          grads.push_back(contiguous_grad(p));
          exp_avgs.push_back(s.exp_avg());
          if (master) masters.push_back(s.master());
          steps.push_back(s.step());
        }
        op.call(bucket, grads, exp_avgs, masters, steps, {}, {}, o.lr(), std::get<0>(o.betas()),
                std::get<1>(o.betas()), o.weight_decay(), o.maximize(), std::nullopt, std::nullopt,
                std::nullopt, coef, 0.0);
      });
}

LAMB::LAMB(const std::vector<torch::optim::OptimizerParamGroup>& param_groups, LAMBOptions defaults)
    : Optimizer(param_groups, std::make_unique<LAMBOptions>(defaults)) {
  restore_group_options("LAMB", *this, param_groups, defaults);
  check_lion_family_options("LAMB", defaults);
  TORCH_CHECK(defaults.eps() >= 0, "torchspeed.optim.LAMB: eps must be >= 0, got ", defaults.eps());
  check_params("LAMB", *this);
}

torch::Tensor LAMB::step(LossClosure closure) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("torchspeed::lamb_step_", "")
                       .typed<void(at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                                   at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                                   double, double, double, double, double, bool, const OptTensor&,
                                   const OptTensor&, const OptTensor&, const OptTensor&, double)>();
  return fused_step<LAMBOptions>(
      *this, "LAMB", closure, [&](const LAMBOptions& o, const auto& bucket, const OptTensor& coef) {
        std::vector<at::Tensor> grads, exp_avgs, exp_avg_sqs, masters, steps;
        for (const auto& p : bucket) {
          const bool master = wants_master(o.master_weights(), p);
          auto& s = state_of<LAMBParamState>(*this, p, master, [&](LAMBParamState& fresh) {
            fresh.step(zero_step(p));
            fresh.exp_avg(fp32_zeros_like(p));
            fresh.exp_avg_sq(fp32_zeros_like(p));
          });
          grads.push_back(contiguous_grad(p));
          exp_avgs.push_back(s.exp_avg());
          exp_avg_sqs.push_back(s.exp_avg_sq());
          if (master) masters.push_back(s.master());
          steps.push_back(s.step());
        }
        op.call(bucket, grads, exp_avgs, exp_avg_sqs, masters, steps, {}, {}, o.lr(),
                std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(),
                o.maximize(), std::nullopt, std::nullopt, std::nullopt, coef, 0.0);
      });
}

// add_param_group, save and load: the same for every optimizer.
#define TORCHSPEED_DEFINE_GROUPS_AND_IO(Cls, State, Options)                        \
  void Cls::add_param_group(const torch::optim::OptimizerParamGroup& param_group) { \
    add_group<Options>(#Cls, *this, param_group);                                   \
  }                                                                                 \
  void Cls::save(torch::serialize::OutputArchive& archive) const {                  \
    torch::optim::serialize<State, Options>(archive, *this);                        \
  }                                                                                 \
  void Cls::load(torch::serialize::InputArchive& archive) {                         \
    torch::optim::serialize<State, Options>(archive, *this);                        \
  }
TORCHSPEED_DEFINE_GROUPS_AND_IO(Adam, AdamParamState, AdamOptions)
TORCHSPEED_DEFINE_GROUPS_AND_IO(AdamW, AdamWParamState, AdamWOptions)
TORCHSPEED_DEFINE_GROUPS_AND_IO(SGD, SGDParamState, SGDOptions)
TORCHSPEED_DEFINE_GROUPS_AND_IO(Lion, LionParamState, LionOptions)
TORCHSPEED_DEFINE_GROUPS_AND_IO(LAMB, LAMBParamState, LAMBOptions)
#undef TORCHSPEED_DEFINE_GROUPS_AND_IO

}  // namespace torchspeed::optim
