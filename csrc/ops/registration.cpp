// The torchspeed op library. Each area defines its ops' schemas in its own file with
// TORCH_LIBRARY_FRAGMENT(torchspeed, m) next to their C++ entry points (csrc/ops/optim.cpp, ...);
// implementations register per dispatch key in ops/cpu, ops/cuda and ops/meta. This definition
// claims the namespace, so that no other library can define ops in it.
#include <torch/library.h>

TORCH_LIBRARY(torchspeed, m) { static_cast<void>(m); }
