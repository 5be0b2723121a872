// Option and state I/O of the C++ fused optimizers (options_io.h): equality, archive read/write
// and checks of every field, generated from the field lists in the public headers, and the public
// options and state classes' member functions.
#include "optim/options_io.h"

#include <torch/serialize/archive.h>

#include <cmath>
#include <string_view>
#include <type_traits>

#include "ops/optim_checks.h"
#include "torchspeed/optim/hyperparams.h"

namespace torchspeed::optim {
namespace detail {
namespace {

using OptTensor = std::optional<at::Tensor>;

// ---- one field: equality, archive, checks -------------------------------------------------------

template <class T>
bool same_value(const T& a, const T& b) {
  return a == b;
}
bool same_value(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() == b.defined() && (!a.defined() || a.is_same(b));
}
bool same_value(const OptTensor& a, const OptTensor& b) {
  return a.has_value() == b.has_value() && (!a || same_value(*a, *b));
}

template <class T>
c10::IValue to_ivalue(const T& v) {
  return c10::IValue(v);
}
template <class T>
c10::IValue to_ivalue(const std::optional<T>& v) {
  return v ? c10::IValue(*v) : c10::IValue();
}

template <class T>
struct FromIValue {
  static T get(const c10::IValue& v) { return v.to<T>(); }
};
template <class T>
struct FromIValue<std::optional<T>> {
  static std::optional<T> get(const c10::IValue& v) {
    return v.isNone() ? std::nullopt : std::optional<T>(v.to<T>());
  }
};

// One option through the validator the Python optimizers share (torchspeed/optim/hyperparams.h);
// `where` is "" for the defaults, "param_groups[i]." for a group.
void check_field(const char* name, const std::string& where, const char* field, double v, bool) {
  check_hyperparameter(name, where + field, v);
}
void check_field(const char*, const std::string&, const char*, bool, bool) {}
// state_dtype, min_lowbit_numel and state_block are checked together (check_state_options).
void check_field(const char*, const std::string&, const char*, const std::string&, bool) {}
void check_field(const char*, const std::string&, const char*, int64_t, bool) {}
void check_field(const char*, const std::string&, const char*, const std::optional<bool>&, bool) {}
void check_field(const char* name, const std::string& where, const char* field,
                 const std::optional<double>& v, bool) {
  if (v) check_hyperparameter(name, where + field, *v);
}
void check_field(const char* name, const std::string& where, const char*, const betas_t& b, bool) {
  check_hyperparameter(name, where + "betas[0]", std::get<0>(b));
  check_hyperparameter(name, where + "betas[1]", std::get<1>(b));
}
// The lr tensor: one element of a floating dtype; its value is checked as lr's, except on the step
// path of a device tensor (reading it there would synchronise), as in Python.
void check_field(const char* name, const std::string& where, const char*, const OptTensor& t,
                 bool at_step) {
  if (!t) return;
  TORCH_CHECK_VALUE(t->defined() && t->numel() == 1 && t->is_floating_point(), "torchspeed.optim.",
                    name, ": ", where,
                    "lr_tensor must be a one-element floating-point tensor, got ",
                    t->defined() ? c10::str(t->scalar_type(), " ", t->sizes()) : "undefined");
  if (!at_step || t->device().is_cpu()) check_hyperparameter(name, where + "lr", t->item<double>());
}

// A fresh options object, to tell the fields a group left at their defaults.
template <class Options>
Options fresh_options(const Options&) {
  return Options();
}
SGDOptions fresh_options(const SGDOptions& user) { return SGDOptions(user.lr()); }

bool is_lowbit_dtype(at::ScalarType t) {
  return t == at::kBFloat16 || t == at::kChar || t == at::kByte;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The elements of a dense tensor in memory order (any memory format).
at::Tensor flat_in_memory_order(const at::Tensor& t) { return t.as_strided({t.numel()}, {1}); }

// A tensor of `dtype` laid out like `p` whose memory holds `flat` (memory order), as Python's
// _lowbit._laid_out: int8 blocks run over the param's memory, whatever its memory format.
at::Tensor laid_out_from_flat(const at::Tensor& flat, const at::Tensor& p, at::ScalarType dtype) {
  at::Tensor out = at::empty_like(p, p.options().dtype(dtype));
  flat_in_memory_order(out).copy_(flat.reshape({-1}));
  return out;
}

// An undefined state tensor of a loaded state is left undefined; a defined one may sit on another
// device, have another dtype or memory layout, or (step) another shape. Low-bit moments keep their
// dtype: bfloat16 ones go to the same logical positions in p's layout, int8 codes keep their own
// (dense) layout, whose memory order their blocks run over (load_in_format lays them out like p),
// and an absmax becomes a flat contiguous tensor of its own dtype; dtypes and sizes are checked
// by load_in_format, as Python's LowbitMoments._load_value / _load_state.
void place_on(at::Tensor& t, const at::Tensor& p, std::string_view name, bool lowbit_moments) {
  if (!t.defined()) return;
  if (name == "step") {
    t = t.to(p.device(), at::kFloat).reshape({});
  } else if (ends_with(name, "_absmax")) {
    t = t.to(p.device()).contiguous().reshape({-1});
  } else if (lowbit_moments && t.scalar_type() == at::kBFloat16) {
    if (t.device() != p.device() || !ops::laid_out_like(t, p)) {
      t = ops::copy_laid_out_like(t.to(p.device()).reshape(p.sizes()), p, at::kBFloat16);
    }
  } else if (lowbit_moments && is_lowbit_dtype(t.scalar_type())) {
    t = t.to(p.device());
    if (!t.is_non_overlapping_and_dense()) t = t.contiguous();
  } else if (t.device() != p.device() || t.scalar_type() != at::kFloat ||
             !ops::laid_out_like(t, p)) {
    t = like_param(t.to(p.device()).reshape(p.sizes()), p);
  }
}

}  // namespace

bool is_supported_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

bool wants_master(const std::optional<bool>& master_weights, const at::Tensor& p) {
  return (p.scalar_type() == at::kBFloat16 || p.scalar_type() == at::kHalf) &&
         master_weights.value_or(true);
}

at::Tensor like_param(const at::Tensor& src, const at::Tensor& p) {
  return ops::copy_laid_out_like(src, p, at::kFloat);
}

at::Tensor zeros_like_param(const at::Tensor& p) {
  return at::zeros_like(p, p.options().dtype(at::kFloat));
}

at::Tensor zero_step(const at::Tensor& p) { return at::zeros({}, p.options().dtype(at::kFloat)); }

std::string group_prefix(size_t g) { return c10::str("param_groups[", g, "]."); }

// ---- options: generated from each class's field list --------------------------------------------

#define TORCHSPEED_OPTION_EQ(type, name, init) &&same_value(lhs.name(), rhs.name())
#define TORCHSPEED_OPTION_SAVE(type, name, init) archive.write(#name, to_ivalue(name()));
// An option missing from an archive (one saved by an older version) keeps its default.
#define TORCHSPEED_OPTION_LOAD(type, name, init)                    \
  {                                                                 \
    c10::IValue v;                                                  \
    if (archive.try_read(#name, v)) name(FromIValue<type>::get(v)); \
  }
#define TORCHSPEED_OPTION_INHERIT(type, name, init) \
  if (same_value(user.name(), fresh.name())) merged.name(defaults.name());
#define TORCHSPEED_OPTION_CHECK(type, name, init) \
  check_field(optimizer, where, #name, o.name(), at_step);

// torch::optim::Optimizer::add_param_group merges a group's own options with the defaults only for
// torch's option types and otherwise replaces them by the defaults; merge_options restores them
// with torch's rule: a field left at its constructor default inherits the optimizer's default
// (SGD has no default lr: a group's lr is always its own).
#define TORCHSPEED_DEFINE_OPTION_FUNCTIONS(Options, LIST)                               \
  void check_options(const char* optimizer, const std::string& where, const Options& o, \
                     bool at_step){                                                     \
      LIST(TORCHSPEED_OPTION_CHECK)} Options merge_options(const Options& user,         \
                                                           const Options& defaults) {   \
    const Options fresh = fresh_options(user);                                          \
    Options merged = user;                                                              \
    LIST(TORCHSPEED_OPTION_INHERIT)                                                     \
    if constexpr (std::is_same_v<Options, SGDOptions>) merged.lr(user.lr());            \
    return merged;                                                                      \
  }
TORCHSPEED_DEFINE_OPTION_FUNCTIONS(AdamOptions, TORCHSPEED_ADAM_OPTIONS)
TORCHSPEED_DEFINE_OPTION_FUNCTIONS(AdamWOptions, TORCHSPEED_ADAMW_OPTIONS)
TORCHSPEED_DEFINE_OPTION_FUNCTIONS(SGDOptions, TORCHSPEED_SGD_OPTIONS)
TORCHSPEED_DEFINE_OPTION_FUNCTIONS(LionOptions, TORCHSPEED_LION_OPTIONS)
TORCHSPEED_DEFINE_OPTION_FUNCTIONS(LAMBOptions, TORCHSPEED_LAMB_OPTIONS)
#undef TORCHSPEED_DEFINE_OPTION_FUNCTIONS

// ---- state: generated from each class's tensor list ---------------------------------------------

#define TORCHSPEED_STATE_SAVE(name) \
  if (name().defined()) archive.write(#name, name());
#define TORCHSPEED_STATE_LOAD(name)          \
  {                                          \
    at::Tensor t;                            \
    if (archive.try_read(#name, t)) name(t); \
  }
#define TORCHSPEED_STATE_PLACE(name) \
  place_on(s.name(), p, #name, kHasLowbitMoments<std::decay_t<decltype(s)>>);
// Every state tensor must have its param's number of elements; `step` one; an absmax is checked
// with its format (load_in_format).
#define TORCHSPEED_STATE_CHECK(name)                                                         \
  if (s.name().defined() && !ends_with(#name, "_absmax")) {                                  \
    const bool is_step = std::string_view(#name) == "step";                                  \
    const int64_t want = is_step ? 1 : p.numel();                                            \
    TORCH_CHECK_VALUE(s.name().numel() == want, "torchspeed.optim.", optimizer, ": ", where, \
                      "." #name " must have ", want, is_step ? " element" : " elements",     \
                      is_step ? "" : " like its param", ", got shape ", s.name().sizes());   \
  }
#define TORCHSPEED_DEFINE_STATE_FUNCTIONS(State, LIST, HAS_MOMENTS)                 \
  void place_state(State& s, const at::Tensor& p) { LIST(TORCHSPEED_STATE_PLACE) }  \
  void check_state(const char* optimizer, const std::string& where, const State& s, \
                   const at::Tensor& p) {                                           \
    LIST(TORCHSPEED_STATE_CHECK)                                                    \
    check_step_count(optimizer, where, s.step(), HAS_MOMENTS);                      \
  }
namespace {
// The step count of a loaded state, as Python's FusedOptimizer._load_value / _load_state: present
// beside moments that need it (bias correction, the low-bit rounding seeds: a missing one used to
// restart at 0 under the loaded moments), and a finite number >= 0.
void check_step_count(const char* optimizer, const std::string& where, const at::Tensor& step,
                      bool has_moments) {
  TORCH_CHECK_VALUE(step.defined() || !has_moments, "torchspeed.optim.", optimizer, ": ", where,
                    ".step must be defined beside the moments (the steps taken), got none");
  if (!step.defined() || step.numel() != 1) return;
  const double count = step.to(at::kDouble).item<double>();
  TORCH_CHECK_VALUE(std::isfinite(count) && count >= 0, "torchspeed.optim.", optimizer, ": ", where,
                    ".step must be a finite number >= 0 (the steps taken), got ", count);
}
}  // namespace
TORCHSPEED_DEFINE_STATE_FUNCTIONS(AdamParamState, TORCHSPEED_ADAM_STATE, s.exp_avg().defined())
TORCHSPEED_DEFINE_STATE_FUNCTIONS(SGDParamState, TORCHSPEED_SGD_STATE, false)
TORCHSPEED_DEFINE_STATE_FUNCTIONS(LionParamState, TORCHSPEED_LION_STATE, s.exp_avg().defined())
TORCHSPEED_DEFINE_STATE_FUNCTIONS(LAMBParamState, TORCHSPEED_LAMB_STATE, s.exp_avg().defined())
#undef TORCHSPEED_DEFINE_STATE_FUNCTIONS

// ---- low-bit moments ----------------------------------------------------------------------------

void check_state_options(const char* optimizer, const std::string& where,
                         const std::string& state_dtype, int64_t min_lowbit_numel,
                         int64_t state_block, bool amsgrad) {
  try {
    ::torchspeed::lowbit_state_format(state_dtype, 0, min_lowbit_numel, state_block);
  } catch (const c10::ValueError& e) {
    // The validator's first line without its op prefix, after the optimizer's (as Python's
    // _lowbit._message): "torchspeed.optim.AdamW: param_groups[1].state_block must be ...".
    std::string msg = e.msg().substr(0, e.msg().find('\n'));
    if (msg.rfind("torchspeed.", 0) == 0 && msg.find(": ") != std::string::npos) {
      msg = msg.substr(msg.find(": ") + 2);
    }
    TORCH_CHECK_VALUE(false, "torchspeed.optim.", optimizer, ": ", where, msg);
  }
  TORCH_CHECK_VALUE(!amsgrad || state_dtype == "fp32", "torchspeed.optim.", optimizer, ": ", where,
                    "amsgrad needs state_dtype='fp32' (the running maximum of the second moment "
                    "is kept in float32), got '",
                    state_dtype, "'");
}

MomentFormat format_named(const std::string& name) {
  if (name == "fp32") return MomentFormat::kFp32;
  if (name == "bf16") return MomentFormat::kBf16;
  TORCH_INTERNAL_ASSERT(name == "int8", "unknown moment format ", name);
  return MomentFormat::kInt8;
}

const char* format_name(MomentFormat format) {
  constexpr const char* kNames[] = {"fp32", "bf16", "int8", "none"};
  return kNames[static_cast<int>(format)];
}

namespace {

// One low-bit moment of a state (Python's `_lowbit_moments` entry): its codes (or float32 /
// bfloat16 values), its absmax, the keys of both, and whether its map is signed.
struct Moment {
  const char* key;
  const char* absmax_key;
  at::Tensor& values;
  at::Tensor& absmax;
  bool is_signed;
};
std::vector<Moment> moments_of(AdamParamState& s) {
  return {{"exp_avg", "exp_avg_absmax", s.exp_avg(), s.exp_avg_absmax(), true},
          {"exp_avg_sq", "exp_avg_sq_absmax", s.exp_avg_sq(), s.exp_avg_sq_absmax(), false}};
}
std::vector<Moment> moments_of(LionParamState& s) {
  return {{"exp_avg", "exp_avg_absmax", s.exp_avg(), s.exp_avg_absmax(), true}};
}
std::vector<Moment> moments_of(SGDParamState& s) {
  return {{"momentum_buffer", "momentum_buffer_absmax", s.momentum_buffer(),
           s.momentum_buffer_absmax(), true}};
}

}  // namespace

template <class State>
MomentFormat stored_format(const State& s) {
  const at::Tensor& first = moments_of(const_cast<State&>(s))[0].values;
  if (!first.defined()) return MomentFormat::kNone;
  switch (first.scalar_type()) {
    case at::kBFloat16:
      return MomentFormat::kBf16;
    case at::kChar:
    case at::kByte:
      return MomentFormat::kInt8;
    default:
      return MomentFormat::kFp32;
  }
}

template <class State>
void set_moments(State& s, const at::Tensor& p, MomentFormat format, int64_t state_block,
                 const std::vector<at::Tensor>& values) {
  const std::vector<Moment> moments = moments_of(s);
  TORCH_INTERNAL_ASSERT(values.empty() || values.size() == moments.size());
  for (size_t k = 0; k < moments.size(); ++k) {
    const Moment& m = moments[k];
    const at::Tensor v = values.empty() ? zeros_like_param(p) : values[k];
    m.absmax = at::Tensor();
    if (format == MomentFormat::kFp32) {
      m.values = v;
    } else if (format == MomentFormat::kBf16) {
      m.values = v.to(at::kBFloat16);
    } else {
      TORCH_INTERNAL_ASSERT(format == MomentFormat::kInt8, "no moment format to set");
      // The step's own quantizer over the param's memory order (Python's _lowbit.to_format).
      LowbitEncodeArgs e;
      e.state_block = state_block;
      e.values = flat_in_memory_order(v).contiguous();
      e.is_signed = m.is_signed;
      const auto [codes, absmax] = lowbit_encode(e);
      m.values = laid_out_from_flat(codes, p, m.is_signed ? at::kChar : at::kByte);
      m.absmax = absmax.to(p.device());
    }
  }
}

namespace {

// An int8 state as Python's LowbitMoments._check_int8_state: codes of the param's numel, one
// finite absmax >= 0 per block of the group's state_block.
void check_int8_state(const char* optimizer, const std::string& where,
                      const std::vector<Moment>& moments, const at::Tensor& p,
                      int64_t state_block) {
  const int64_t blocks = (p.numel() + state_block - 1) / state_block;
  struct Want {
    const char* key;
    const at::Tensor& t;
    at::ScalarType dtype;
    int64_t numel;
  };
  std::vector<Want> wants;
  for (const Moment& m : moments) {
    wants.push_back({m.key, m.values, m.is_signed ? at::kChar : at::kByte, p.numel()});
  }
  for (const Moment& m : moments) wants.push_back({m.absmax_key, m.absmax, at::kFloat, blocks});
  for (const auto& w : wants) {
    TORCH_CHECK_VALUE(
        w.t.defined() && w.t.scalar_type() == w.dtype && w.t.numel() == w.numel,
        "torchspeed.optim.", optimizer, ": ", where, ".", w.key, " of an int8 state must be ",
        w.dtype, " with ", w.numel, " elements (state_block ", state_block, "), got ",
        w.t.defined() ? c10::str(w.t.scalar_type(), " with ", w.t.numel(), " elements")
                      : std::string("None"));
  }
  for (size_t k = moments.size(); k < wants.size(); ++k) {
    const Want& w = wants[k];
    const bool ok =
        w.t.numel() == 0 || (at::isfinite(w.t).all().item<bool>() && !(w.t < 0).any().item<bool>());
    TORCH_CHECK_VALUE(ok, "torchspeed.optim.", optimizer, ": ", where, ".", w.key,
                      " must hold finite values >= 0 (one absmax per block), got min ",
                      w.t.min().item<float>(), " max ", w.t.max().item<float>());
  }
}

// float32 moments laid out like p, from a state of any stored format (int8: the step's decoder).
at::Tensor moment_fp32(const at::Tensor& codes, const at::Tensor& absmax, const at::Tensor& p,
                       int64_t state_block) {
  if (!absmax.defined()) return codes.to(at::kFloat);
  LowbitDecodeArgs d;
  d.codes = flat_in_memory_order(codes);
  d.absmax = absmax;
  d.state_block = state_block;
  return laid_out_from_flat(lowbit_decode(d), p, at::kFloat);
}

}  // namespace

template <class State>
void load_in_format(const char* optimizer, const std::string& where, State& s, const at::Tensor& p,
                    MomentFormat format, int64_t state_block, int64_t saved_block) {
  const std::vector<Moment> moments = moments_of(s);
  const auto is_codes = [](const at::Tensor& t) {
    return t.defined() && (t.scalar_type() == at::kChar || t.scalar_type() == at::kByte);
  };
  bool int8 = false, all_defined = true;
  for (const Moment& m : moments) {
    int8 = int8 || m.absmax.defined() || is_codes(m.values);
    all_defined = all_defined && m.values.defined();
  }
  if (int8) {
    check_int8_state(optimizer, where, moments, p, saved_block);
    bool relaid = saved_block != state_block;
    for (const Moment& m : moments) relaid = relaid || !ops::laid_out_like(m.values, p);
    if (relaid && format != MomentFormat::kNone) {
      // Codes of another state_block, or in another memory layout than p's (e.g. saved from a
      // contiguous param, loaded for a channels_last one): decoded with their block in their own
      // memory order, moved to the same logical positions in p's layout, and converted to the
      // group's format from float32.
      std::vector<at::Tensor> values;
      for (const Moment& m : moments) {
        LowbitDecodeArgs d;
        d.codes = flat_in_memory_order(m.values);
        d.absmax = m.absmax;
        d.state_block = saved_block;
        const at::Tensor flat = lowbit_decode(d);
        values.push_back(m.values.sizes() == p.sizes()
                             ? like_param(laid_out_from_flat(flat, m.values, at::kFloat), p)
                             : laid_out_from_flat(flat, p, at::kFloat));
      }
      set_moments(s, p, format, state_block, values);
      return;
    }
  } else if (all_defined) {
    for (const Moment& m : moments) {
      TORCH_CHECK_VALUE(m.values.scalar_type() == moments[0].values.scalar_type(),
                        "torchspeed.optim.", optimizer, ": ", where, ": ", moments[0].key, " and ",
                        m.key, " must have one format, got ", moments[0].values.scalar_type(),
                        " and ", m.values.scalar_type());
    }
  }
  // Missing moments are created by the next step, in the group's format.
  if (format == MomentFormat::kNone || !all_defined) return;
  if (stored_format(s) == format) return;
  if (format == MomentFormat::kInt8 && !int8) {
    // As Python's LowbitMoments._check_quantizable: lowbit_encode maps NaN to the block's largest
    // code and a negative unsigned moment to 0, so such moments would come back changed.
    for (const Moment& m : moments) {
      const at::Tensor v = m.values.to(at::kFloat);
      const at::Tensor bad =
          m.is_signed ? at::isfinite(v).logical_not() : at::logical_not(at::isfinite(v) & (v >= 0));
      TORCH_CHECK_VALUE(!bad.any().item<bool>(), "torchspeed.optim.", optimizer, ": ", where, ".",
                        m.key, " must be ", m.is_signed ? "finite" : "finite and >= 0",
                        " to be quantized to int8 (state_dtype 'int8'), got ",
                        v.masked_select(bad)[0].item<float>());
    }
  }
  std::vector<at::Tensor> values;
  for (const Moment& m : moments) {
    values.push_back(moment_fp32(m.values, m.absmax, p, state_block));
  }
  set_moments(s, p, format, state_block, values);
}

#define TORCHSPEED_INSTANTIATE_LOWBIT(State)                                               \
  template MomentFormat stored_format(const State&);                                       \
  template void set_moments(State&, const at::Tensor&, MomentFormat, int64_t,              \
                            const std::vector<at::Tensor>&);                               \
  template void load_in_format(const char*, const std::string&, State&, const at::Tensor&, \
                               MomentFormat, int64_t, int64_t);
TORCHSPEED_INSTANTIATE_LOWBIT(AdamParamState)
TORCHSPEED_INSTANTIATE_LOWBIT(LionParamState)
TORCHSPEED_INSTANTIATE_LOWBIT(SGDParamState)
#undef TORCHSPEED_INSTANTIATE_LOWBIT

}  // namespace detail

// The class members below expand the field macros, which name the helpers above.
using namespace detail;  // NOLINT(google-build-using-namespace)

// ---- the public classes: options and state ------------------------------------------------------

#define TORCHSPEED_DEFINE_OPTIONS_CLASS(Options, LIST)                      \
  Options::Options(double lr) : lr_(lr) {}                                  \
  double Options::get_lr() const { return lr(); }                           \
  void Options::set_lr(const double lr) { this->lr(lr); }                   \
  bool operator==(const Options& lhs, const Options& rhs) {                 \
    return true LIST(TORCHSPEED_OPTION_EQ);                                 \
  }                                                                         \
  void Options::serialize(torch::serialize::OutputArchive& archive) const { \
    LIST(TORCHSPEED_OPTION_SAVE)                                            \
  }                                                                         \
  void Options::serialize(torch::serialize::InputArchive& archive) { LIST(TORCHSPEED_OPTION_LOAD) }
TORCHSPEED_DEFINE_OPTIONS_CLASS(AdamOptions, TORCHSPEED_ADAM_OPTIONS)
TORCHSPEED_DEFINE_OPTIONS_CLASS(AdamWOptions, TORCHSPEED_ADAMW_OPTIONS)
TORCHSPEED_DEFINE_OPTIONS_CLASS(SGDOptions, TORCHSPEED_SGD_OPTIONS)
TORCHSPEED_DEFINE_OPTIONS_CLASS(LionOptions, TORCHSPEED_LION_OPTIONS)
TORCHSPEED_DEFINE_OPTIONS_CLASS(LAMBOptions, TORCHSPEED_LAMB_OPTIONS)
#undef TORCHSPEED_DEFINE_OPTIONS_CLASS

// An undefined state tensor (e.g. no master) is not written, and stays undefined on load.
#define TORCHSPEED_DEFINE_STATE_CLASS(State, LIST)                        \
  void State::serialize(torch::serialize::OutputArchive& archive) const { \
    LIST(TORCHSPEED_STATE_SAVE)                                           \
  }                                                                       \
  void State::serialize(torch::serialize::InputArchive& archive) { LIST(TORCHSPEED_STATE_LOAD) }
TORCHSPEED_DEFINE_STATE_CLASS(AdamParamState, TORCHSPEED_ADAM_STATE)
TORCHSPEED_DEFINE_STATE_CLASS(SGDParamState, TORCHSPEED_SGD_STATE)
TORCHSPEED_DEFINE_STATE_CLASS(LionParamState, TORCHSPEED_LION_STATE)
TORCHSPEED_DEFINE_STATE_CLASS(LAMBParamState, TORCHSPEED_LAMB_STATE)
#undef TORCHSPEED_DEFINE_STATE_CLASS

}  // namespace torchspeed::optim
