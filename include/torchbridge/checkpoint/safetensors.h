#pragma once
// safetensors in C++: a memory-mapped, lazily read, strictly validated reader and an atomic,
// conformant writer. Format: 8-byte little-endian header length N, N bytes of JSON header
// (name -> {dtype, shape, data_offsets}, optional "__metadata__": {str: str}), then the data.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::checkpoint {

// The dtypes torch and safetensors share, by their safetensors names.
c10::ScalarType dtype_from_safetensors(const std::string& name);  // raises for unknown names
std::string safetensors_dtype_name(c10::ScalarType dtype);         // raises for unsupported dtypes
bool holds_dtype(c10::ScalarType dtype);  // whether safetensors has a name for it
// Values per torch element: 2 for float4_e2m1fn_x2 (safetensors' F4, two values a byte), else 1. A
// safetensors shape counts values, so F4's last dimension is twice torch's.
int64_t values_per_element(c10::ScalarType dtype);
// The shape a safetensors header gives a tensor of these sizes (raises for a 0-dim F4 tensor, whose
// two values have no dimension to be counted in).
std::vector<int64_t> safetensors_shape(c10::ScalarType dtype, c10::IntArrayRef sizes);

struct TensorRecord {
  std::string name;
  c10::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets inside the data section
  uint64_t end = 0;
};

class SafetensorsFile {
 public:
  // Maps and validates `path`; reads no tensor data. Every problem raises a ValueError naming the
  // file, the tensor when there is one, and what is wrong.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return path_; }
  // Tensors in data-section order.
  const std::vector<TensorRecord>& tensors() const { return records_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const;
  const TensorRecord& record(const std::string& name) const;  // raises naming the missing tensor

  // The tensor `name`. On the CPU it aliases the mapping (no copy) when its data is aligned for
  // its dtype, and is a copy otherwise; writes to an alias never reach the file (private mapping).
  // On another device it is filled by a direct copy from the mapping.
  at::Tensor load(const std::string& name, c10::Device device = c10::Device(c10::kCPU)) const;
  // Whether load(name) on the CPU aliases the mapping.
  bool aliases(const std::string& name) const;

 private:
  struct Mapping;
  std::string path_;
  std::shared_ptr<Mapping> mapping_;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::vector<TensorRecord> records_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (dense ones, on any device, with any strides) to `path` atomically: a temporary file in the same
// directory is written, fsync'ed and renamed over `path`, then the directory is fsync'ed, so a
// crash leaves either the old file or the new one. Tensors whose bytes overlap (tied weights) are
// refused with an error naming both (save clones if sharing is intended); views of one storage
// whose byte spans do not overlap are saved each on its own. Names must be unique; "" is one (the
// safetensors package takes it), "__metadata__" is the header's own key and refused. Sparse,
// meta and quantized tensors are refused, naming the tensor.
void save(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
          const std::map<std::string, std::string>& metadata = {});

// Header limits from the format: at most 100,000,000 header bytes and, here, 64 levels of JSON nesting.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;
inline constexpr int kMaxJsonDepth = 64;

}  // namespace torchbridge::checkpoint
