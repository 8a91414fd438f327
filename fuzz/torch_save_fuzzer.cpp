// libFuzzer target for read_torch_save: each input is the data.pkl of a torch.save archive whose
// other records are fixed (byteorder, and storages data/0..data/3 of 64 bytes each), so every
// execution reaches the pickle machine and the torch globals behind it. It must return tensors
// or raise a c10::Error — never crash, hang or read out of bounds (AddressSanitizer watches).
// Build and run with scripts/fuzz_torch_save.sh, seeded with real torch.save pickles.
#include <torchbridge/checkpoint/checkpoint.h>

#include <caffe2/serialize/inline_container.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>

namespace {

int memory_file() {
  static const int fd = memfd_create("torch-save-fuzz", MFD_CLOEXEC);
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string archive;
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, size_t n) {
      archive.append(static_cast<const char*>(bytes), n);
      return n;
    });
    writer.writeRecord("data.pkl", data, size);
    writer.writeRecord("byteorder", "little", 6);
    const std::string storage(64, '\x3c');
    for (int key = 0; key < 4; ++key) writer.writeRecord("data/" + std::to_string(key), storage.data(), storage.size());
    writer.writeEndOfFile();
  }
  const int fd = memory_file();
  if (ftruncate(fd, 0) != 0 || pwrite(fd, archive.data(), archive.size(), 0) != static_cast<ssize_t>(archive.size())) {
    return 0;
  }
  try {
    for (const auto& [name, tensor] : torchbridge::checkpoint::read_torch_save("/proc/self/fd/" + std::to_string(fd))) {
      (void)tensor.clone();  // reads every element the view claims
    }
  } catch (const c10::Error&) {
    // Rejecting malformed input with an error is the expected outcome.
  }
  return 0;
}
