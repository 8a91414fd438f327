// The device half of bench/checkpoint_benchmark.py: loads every tensor of a safetensors file onto
// an SDK device (emu by default) through the C++ reader, against a memcpy of the same bytes.
// Also times the alternative the reader does not use, staging through two reusable pinned
// buffers, so the choice stays visible. Prints one JSON object (times in seconds).
//
// Usage: checkpoint_device_load FILE [--device emu:0] [--repeats N] [--chunk-mib C] [--cold]
//        checkpoint_device_load FILE --memory   (prints "ready", loads once on a line from stdin,
//                                                prints "done", exits on the next line: the
//                                                Python side samples this process's memory)
#include <torchbridge/checkpoint/checkpoint.h>
#include <torchbridge/pinned_host.h>
#include <torchbridge/registry.h>

#include <ATen/ATen.h>
#include <c10/core/Event.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using torchbridge::checkpoint::Checkpoint;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Drops the file's clean pages from the page cache (no root needed), for cold-cache runs.
void evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

std::vector<at::Tensor> load_direct(const std::string& path, c10::Device device) {
  const Checkpoint checkpoint = Checkpoint::open(path);
  std::vector<at::Tensor> out;
  for (const auto& name : checkpoint.names()) out.push_back(checkpoint.load(name, device));
  return out;
}

// Each tensor's bytes go mapping -> pinned buffer (memcpy) -> device (asynchronous copy on the
// device's stream), alternating two buffers so the next memcpy overlaps the previous upload.
std::vector<at::Tensor> load_staged(const std::string& path, c10::Device device, size_t chunk,
                                    const c10::Stream& stream) {
  const Checkpoint checkpoint = Checkpoint::open(path);
  // Pinned for the target's own device type: pinned_memory(true) pins for CUDA whenever the machine
  // has CUDA, which an SDK device copies synchronously (torchbridge/pinned_host.h).
  const at::Tensor shape = at::empty({int64_t(chunk)}, at::TensorOptions().dtype(at::kByte).device(c10::kMeta));
  at::Tensor buffers[2] = {torchbridge::pinned_host_like(shape, device.type()),
                           torchbridge::pinned_host_like(shape, device.type())};
  c10::Event uploaded[2] = {c10::Event(device.type()), c10::Event(device.type())};
  int next = 0;
  std::vector<at::Tensor> out;
  for (const auto& name : checkpoint.names()) {
    const at::Tensor host = checkpoint.load(name);  // an alias of the mapping
    at::Tensor target = at::empty(host.sizes(), host.options().device(device));
    const size_t bytes = host.nbytes();
    const auto* source = static_cast<const uint8_t*>(host.const_data_ptr());
    at::Tensor target_bytes = target.view({-1}).view(at::kByte);
    for (size_t offset = 0; offset < bytes; offset += chunk) {
      const size_t n = std::min(chunk, bytes - offset);
      uploaded[next].synchronize();  // the buffer's previous upload has finished reading it
      std::memcpy(buffers[next].data_ptr(), source + offset, n);
      target_bytes.slice(0, int64_t(offset), int64_t(offset + n))
          .copy_(buffers[next].slice(0, 0, int64_t(n)), /*non_blocking=*/true);
      uploaded[next].record(stream);
      next ^= 1;
    }
    out.push_back(target);
  }
  for (auto& event : uploaded) event.synchronize();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: checkpoint_device_load FILE [--device emu:0] [--repeats N] [--chunk-mib C] [--cold] "
                 "[--memory]\n";
    return 1;
  }
  const std::string path = argv[1];
  std::string device_name = "emu:0";
  int repeats = 5;
  size_t chunk_mib = 8;
  bool cold = false, memory = false;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--device" && i + 1 < argc) device_name = argv[++i];
    else if (arg == "--repeats" && i + 1 < argc) repeats = std::max(1, std::stoi(argv[++i]));
    else if (arg == "--chunk-mib" && i + 1 < argc) chunk_mib = std::stoul(argv[++i]);
    else if (arg == "--cold") cold = true;
    else if (arg == "--memory") memory = true;
    else {
      std::cerr << "checkpoint_device_load: unknown argument " << arg << "\n";
      return 1;
    }
  }
  const auto backend = torchbridge::create_backend(device_name.substr(0, device_name.find(':')));
  const c10::Device device(device_name);
  const auto sync = [&] { backend->synchronize(device.index()); };

  if (memory) {
    std::string line;
    std::cout << "ready" << std::endl;
    std::getline(std::cin, line);
    std::vector<at::Tensor> loaded = load_direct(path, device);
    sync();
    std::cout << "done" << std::endl;
    std::getline(std::cin, line);
    return 0;
  }

  size_t total = 0;
  const Checkpoint opened = Checkpoint::open(path);  // a named object: shards() refers into it
  for (const auto& shard : opened.shards()) {
    for (const auto& record : shard.tensors()) total += record.end - record.begin;
  }
  // Baselines, taken in each repetition next to the loads so all see the same machine state:
  // one memcpy of as many bytes between two resident anonymous buffers (the goal's baseline),
  // and one memcpy of the file's tensor bytes out of a fresh mapping of it (what any reader of
  // the page cache can reach; information).
  std::vector<uint8_t> from(total, 1), to(total, 2);
  const auto memcpy_from_file = [&] {
    const Checkpoint checkpoint = Checkpoint::open(path);
    size_t offset = 0;
    for (const auto& name : checkpoint.names()) {
      const at::Tensor alias = checkpoint.load(name);
      std::memcpy(to.data() + offset, alias.const_data_ptr(), alias.nbytes());
      offset += alias.nbytes();
    }
  };

  // The first load also makes the device allocate fresh memory (page faults in the emulator's
  // backing store); later loads reuse the caching allocator's blocks. Both are reported.
  std::vector<double> memcpy_s, file_s, direct_s, staged_s;
  double first_s = 0;
  const c10::Stream stream = backend->current_stream(device.index());
  for (int r = 0; r <= repeats; ++r) {
    auto start = Clock::now();
    std::memcpy(to.data(), from.data(), total);
    if (r > 0) memcpy_s.push_back(seconds_since(start));
    if (cold) evict(path);
    start = Clock::now();
    memcpy_from_file();
    if (r > 0) file_s.push_back(seconds_since(start));
    if (cold) evict(path);
    start = Clock::now();
    {
      const auto loaded = load_direct(path, device);
      sync();
      const double s = seconds_since(start);
      if (r == 0) first_s = s;
      else direct_s.push_back(s);
    }
    if (r == 0) continue;
    if (cold) evict(path);
    start = Clock::now();
    {
      const auto loaded = load_staged(path, device, chunk_mib << 20, stream);
      sync();
      staged_s.push_back(seconds_since(start));
    }
  }
  std::printf("{\"bytes\": %zu, \"device\": \"%s\", \"cold\": %s, \"chunk_mib\": %zu, \"memcpy_s\": %.6f, "
              "\"memcpy_from_file_s\": %.6f, \"first_direct_s\": %.6f, \"direct_s\": %.6f, \"staged_s\": %.6f}\n",
              total, device_name.c_str(), cold ? "true" : "false", chunk_mib, median(memcpy_s), median(file_s), first_s,
              median(direct_s), median(staged_s));
  return 0;
}
