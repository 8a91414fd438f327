#include "core/dynamic_library.h"

#include <dlfcn.h>

namespace torchbridge {

DynamicLibrary::DynamicLibrary(const char* soname) {
  handle_ = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) {
    const char* error = dlerror();
    load_error_ = error != nullptr ? error : std::string(soname) + " could not be loaded";
  }
}

DynamicLibrary::~DynamicLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
}

void* DynamicLibrary::symbol(const char* name) const {
  return handle_ != nullptr ? dlsym(handle_, name) : nullptr;
}

}  // namespace torchbridge
