#pragma once
// A vendor library opened at run time with dlopen, so TorchBridge builds and runs on machines
// without that vendor's SDK and can still say precisely what is missing. Internal.

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

 private:
  void* handle_ = nullptr;
  std::string load_error_;
};

}  // namespace torchbridge
