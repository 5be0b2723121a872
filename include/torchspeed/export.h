// Symbol visibility for libtorchspeed: everything is hidden unless marked TORCHSPEED_API.
#pragma once

#if defined(_WIN32)
#if defined(TORCHSPEED_BUILDING_LIBRARY)
#define TORCHSPEED_API __declspec(dllexport)
#else
#define TORCHSPEED_API __declspec(dllimport)
#endif
#else
#define TORCHSPEED_API __attribute__((visibility("default")))
#endif
