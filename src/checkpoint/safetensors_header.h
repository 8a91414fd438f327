#pragma once
// Parsing and validating a safetensors JSON header. Internal to the checkpoint module.

#include <torchbridge/checkpoint/safetensors.h>

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace torchbridge::checkpoint {

struct ParsedHeader {
  std::vector<TensorRecord> records;  // sorted by data offset
  std::map<std::string, std::string> metadata;
};

// Validates `header` against the format's rules for a data section of `data_bytes` bytes.
// Errors name `file`, the tensor (when there is one) and the problem.
ParsedHeader parse_header(const std::string& file, std::string_view header, uint64_t data_bytes);

}  // namespace torchbridge::checkpoint
