// Umbrella header of torchspeed's data-parallel area (built with TORCHSPEED_WITH_DIST):
// AccumulatingDDP over c10d process groups, the process-group helpers for C++ apps, and the
// reducer's bucket op scale_cast_.
//
//   #include <torchspeed/dist.h>
//   auto group = torchspeed::dist::init_process_group_from_env("gloo");   // under torchrun
//   torchspeed::dist::AccumulatingDDP ddp(*model, group,
//                                         torchspeed::dist::DDPOptions().accumulation_steps(8));
#pragma once

#include "torchspeed/dist/ddp.h"
#include "torchspeed/ops/dist.h"
#include "torchspeed/torchspeed.h"
