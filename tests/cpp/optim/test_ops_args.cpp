// Every op's argument struct (include/torchspeed/ops/) against the schema the library registered:
// the same names in the same order, and the struct's defaults equal to the schema's. (The types
// and their order are checked by the dispatcher itself when the kernels taking the struct are
// registered, at library load.)
#include "op_schema_check.h"
#include "torchspeed/torchspeed.h"

using torchspeed_test::check_against_schema;

TEST_CASE("every op's argument struct has its schema's names, order and defaults") {
  check_against_schema<torchspeed::GradStatsArgs>();
  check_against_schema<torchspeed::GradStatsUnscaleArgs>();
  check_against_schema<torchspeed::AdamStepArgs>();
  check_against_schema<torchspeed::AdamLowbitStepArgs>();
  check_against_schema<torchspeed::LowbitEncodeArgs>();
  check_against_schema<torchspeed::LowbitDecodeArgs>();
  check_against_schema<torchspeed::SgdStepArgs>();
  check_against_schema<torchspeed::SgdLowbitStepArgs>();
  check_against_schema<torchspeed::LionStepArgs>();
  check_against_schema<torchspeed::LionLowbitStepArgs>();
  check_against_schema<torchspeed::LambStepArgs>();
}
