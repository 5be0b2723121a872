// Loads the installed libtorchspeed with dlopen from a process that links no torch library, as a
// plugin host or ctypes does: it starts only if the library's own RUNPATH reaches torch's
// libraries.
#include <dlfcn.h>

#include <cstdio>

#ifndef TORCHSPEED_LIBRARY_PATH
#error "build with -DTORCHSPEED_LIBRARY_PATH=\"/path/to/libtorchspeed.so\""
#endif

int main() {
  void* lib = dlopen(TORCHSPEED_LIBRARY_PATH, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::printf("FAILED: dlopen(%s): %s\n", TORCHSPEED_LIBRARY_PATH, dlerror());
    return 1;
  }
  // torchspeed::version() is plain C++ with no torch types, so it can be looked up by its mangled
  // name without torch's headers.
  using VersionFn = const char* (*)();
  auto version = reinterpret_cast<VersionFn>(dlsym(lib, "_ZN10torchspeed7versionEv"));
  if (version == nullptr) {
    std::printf("FAILED: torchspeed::version not exported: %s\n", dlerror());
    return 1;
  }
  std::printf("dlopen_app: loaded %s, torchspeed %s\ndlopen_app OK\n", TORCHSPEED_LIBRARY_PATH,
              version());
  return 0;
}
