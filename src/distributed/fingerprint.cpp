#include <torchbridge/distributed/fingerprint.h>

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdio>

namespace torchbridge::distributed {
namespace {

constexpr uint64_t kOffsetBasis = 14695981039346656037ULL;
constexpr uint64_t kPrime = 1099511628211ULL;

uint64_t mix(uint64_t hash, const void* data, size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) hash = (hash ^ bytes[i]) * kPrime;
  return hash;
}

}  // namespace

uint64_t fingerprint(const std::vector<at::Tensor>& tensors) {
  uint64_t hash = kOffsetBasis;
  for (const auto& tensor : tensors) {
    const at::Tensor bytes = tensor.detach().cpu().contiguous();
    const auto dtype = static_cast<int64_t>(bytes.scalar_type());
    hash = mix(hash, &dtype, sizeof dtype);
    for (const int64_t size : bytes.sizes()) hash = mix(hash, &size, sizeof size);
    hash = mix(hash, bytes.data_ptr(), bytes.nbytes());
  }
  return hash;
}

std::string fingerprint_text(uint64_t fingerprint) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(fingerprint));
  return text;
}

}  // namespace torchbridge::distributed
