// check_against_schema<Args>(): an op's argument struct (include/torchspeed/ops/) against the
// schema the library registered: the same names in the same order, and the struct's defaults equal
// to the schema's. Each area's C++ test calls it for its ops (test_ops_args.cpp, dist/, quant/).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string>
#include <tuple>

#include "catch_shim.h"

namespace torchspeed_test {

inline c10::IValue as_ivalue(const at::TensorList& l) { return c10::IValue(l.vec()); }
inline c10::IValue as_ivalue(const at::Tensor& t) {
  return t.defined() ? c10::IValue(t) : c10::IValue();
}
inline c10::IValue as_ivalue(const std::optional<at::Tensor>& t) {
  return t.has_value() ? c10::IValue(*t) : c10::IValue();
}
inline c10::IValue as_ivalue(double d) { return c10::IValue(d); }
inline c10::IValue as_ivalue(bool b) { return c10::IValue(b); }
inline c10::IValue as_ivalue(int64_t i) { return c10::IValue(i); }

template <class Args>
void check_against_schema() {
  const auto& schema =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow((std::string("torchspeed::") + Args::kName).c_str(), "")
          .schema();
  const auto& arguments = schema.arguments();
  constexpr size_t n = sizeof(Args::kFieldNames) / sizeof(Args::kFieldNames[0]);
  INFO("op " << Args::kName);
  REQUIRE(arguments.size() == n);
  const Args defaults{};
  size_t i = 0;
  std::apply(
      [&](const auto&, const auto&... field) {
        (
            [&](const auto& value) {
              INFO("argument " << i << ": schema " << arguments[i].name() << ", struct "
                               << Args::kFieldNames[i]);
              CHECK(arguments[i].name() == Args::kFieldNames[i]);
              if (arguments[i].default_value().has_value()) {
                CHECK(*arguments[i].default_value() == as_ivalue(value));
              }
              ++i;
            }(field),
            ...);
      },
      defaults.fields());
}

}  // namespace torchspeed_test
