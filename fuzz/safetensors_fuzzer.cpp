// libFuzzer target for the safetensors reader: any byte string, opened as a file, must either
// validate (and then every tensor must load) or raise a c10::Error — never crash, hang or read
// out of bounds (AddressSanitizer watches). Build and run with scripts/fuzz_safetensors.sh.
#include <torchbridge/checkpoint/safetensors.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>

namespace {

int memory_file() {
  static const int fd = memfd_create("safetensors-fuzz", MFD_CLOEXEC);
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memory_file();
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) return 0;
  try {
    const auto file = torchbridge::checkpoint::SafetensorsFile::open("/proc/self/fd/" + std::to_string(fd));
    for (const auto& record : file.tensors()) {
      const at::Tensor t = file.load(record.name);
      if (t.numel() > 0) (void)*static_cast<volatile const uint8_t*>(t.data_ptr());  // touch the data
    }
  } catch (const c10::Error&) {
    // Rejecting malformed input with an error is the expected outcome.
  }
  return 0;
}
