// `torchbridge bench`'s checkpoint group: the safetensors writer and reader against the raw file
// system calls that move the same bytes, so the ratio is what the format and its checks cost.
#include "bench_cases.h"
#include "median_seconds.h"
#include "temporary_directory.h"

#include <torchbridge/backend.h>
#include <torchbridge/checkpoint/checkpoint.h>
#include <torchbridge/checkpoint/safetensors.h>
#include <torchbridge/registry.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::cli {
namespace {

// The baseline writer: the tensors' bytes, one write() each, then fsync, as the atomic writer
// ends with fsync too.
void write_raw(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  TORCH_CHECK(fd >= 0, "cannot create ", path, ": ", std::strerror(errno));
  for (const auto& [name, tensor] : tensors) {
    const char* data = static_cast<const char*>(tensor.data_ptr());
    for (size_t done = 0, size = tensor.nbytes(); done < size;) {
      const ssize_t n = ::write(fd, data + done, size - done);
      TORCH_CHECK(n > 0, "write to ", path, " failed: ", std::strerror(errno));
      done += static_cast<size_t>(n);
    }
  }
  TORCH_CHECK(::fsync(fd) == 0 && ::close(fd) == 0, "fsync of ", path, " failed: ", std::strerror(errno));
}

// The baseline reader: as many bytes as the tensors hold, read() from the file into new CPU
// tensors of their sizes (the same allocator as the loader's copies, so memory costs the same).
void read_raw(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& like) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  TORCH_CHECK(fd >= 0, "cannot open ", path, ": ", std::strerror(errno));
  for (const auto& [name, tensor] : like) {
    at::Tensor target = at::empty_like(tensor);
    char* data = static_cast<char*>(target.data_ptr());
    for (size_t done = 0, size = target.nbytes(); done < size;) {
      const ssize_t n = ::read(fd, data + done, size - done);
      TORCH_CHECK(n > 0, "read of ", path, " failed: ", std::strerror(errno));
      done += static_cast<size_t>(n);
    }
  }
  ::close(fd);
}

}  // namespace

std::vector<BenchResult> bench_checkpoint(const std::vector<std::string>& backends, const BenchOptions& options) {
  const int repeats = options.quick ? 3 : 7;
  const int count = options.quick ? 4 : 16;  // tensors of 4 MiB each
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (int i = 0; i < count; ++i) tensors.emplace_back("layers." + std::to_string(i) + ".weight", at::randn({1024, 1024}));
  const std::string size = std::to_string(count * 4) + " MiB";
  const TemporaryDirectory scratch("torchbridge-bench");
  const std::string path = scratch.file("model.safetensors"), raw = scratch.file("model.raw");
  std::vector<BenchResult> results;

  if (options.progress) options.progress("checkpoint: save " + size);
  const double save_raw = median_seconds(repeats, [&] { write_raw(raw, tensors); });
  const double save = median_seconds(repeats, [&] { checkpoint::save(path, tensors, {}); });
  results.push_back({"checkpoint", "cpu", "save " + size + " (atomic, fsync)", "ms", "write() + fsync", save_raw * 1e3,
                     save * 1e3, false, std::nullopt, ""});

  const double read_seconds = median_seconds(repeats, [&] { read_raw(path, tensors); });
  for (const auto& name : backends) {
    const auto backend = create_backend(name);
    const c10::Device device = backend->device(0);
    if (options.progress) options.progress("checkpoint " + name + ": load " + size);
    const double load = median_seconds(repeats, [&] {
      const auto file = checkpoint::Checkpoint::open(path);
      for (const auto& tensor_name : file.names()) {
        at::Tensor loaded = file.load(tensor_name, device);
        // On the CPU the reader maps the file; a copy touches every byte, as read() does.
        if (device.is_cpu()) loaded = loaded.clone();
      }
      backend->synchronize(0);
    });
    results.push_back({"checkpoint", name, "load " + size + " onto " + device.str(), "ms", "read() into tensors",
                       read_seconds * 1e3, load * 1e3, false, std::nullopt,
                       device.is_cpu() ? "mapped, then copied" : "through the C++ reader"});
  }
  return results;
}

}  // namespace torchbridge::cli
