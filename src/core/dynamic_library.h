#pragma once
// A library opened at run time with dlopen: vendor libraries, so TorchBridge builds and runs on
// machines without that vendor's SDK and can still say precisely what is missing, and SDK device
// libraries. Closed when destroyed unless kept for the process. Internal.

#include <string>

namespace torchbridge {

class DynamicLibrary {
 public:
  explicit DynamicLibrary(const char* soname);
  ~DynamicLibrary();
  DynamicLibrary(const DynamicLibrary&) = delete;
  DynamicLibrary& operator=(const DynamicLibrary&) = delete;

  bool loaded() const { return handle_ != nullptr; }
  const std::string& load_error() const { return load_error_; }
  // The symbol's address, or nullptr when the library is not loaded or lacks it.
  void* symbol(const char* name) const;
  template <typename Fn>
  Fn function(const char* name) const { return reinterpret_cast<Fn>(symbol(name)); }
  // Leaves the library loaded when this object goes: for libraries whose code stays registered
  // with torch (an SDK device's runtime table) for the rest of the process.
  void keep_for_process() { handle_ = nullptr; }

 private:
  void* handle_ = nullptr;
  std::string load_error_;
};

}  // namespace torchbridge
