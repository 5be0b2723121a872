// Umbrella header for torchspeed's data loader (built with TORCHSPEED_WITH_DATA; find_package(
// torchspeed COMPONENTS data) checks it): torchspeed::data::Loader over WebDataset shards, .npy
// arrays or tensors, and its options and statistics.
//
//   #include <torchspeed/data.h>
//   torchspeed::data::LoaderOptions opt;
//   opt.batch_size = 256;
//   torchspeed::data::Loader loader(torchspeed::data::webdataset_source(wds), opt);
#pragma once

#include "torchspeed/data/loader.h"
#include "torchspeed/data/options.h"
#include "torchspeed/torchspeed.h"
