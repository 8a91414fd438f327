#include "checkpoint/safetensors_header.h"

#include "core/strict_json.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::checkpoint {
namespace {

using json = nlohmann::json;

// `tensor`: the tensor the problem is in, or none for the header as a whole ("" is a tensor's name).
[[noreturn]] void fail(const std::string& file, const std::optional<std::string>& tensor, const std::string& problem) {
  TORCH_CHECK_VALUE(false, file, ": ", tensor ? "tensor '" + *tensor + "': " : std::string(), problem);
}

// Bounded nesting and unique keys in every object (the JSON library would otherwise keep the last
// duplicate silently).
json parse_strictly(const std::string& file, std::string_view text) {
  const auto on_problem = [&](detail::JsonProblem problem, const std::string& key,
                              const std::vector<std::string>& enclosing_keys) {
    if (problem == detail::JsonProblem::too_deep) {
      fail(file, std::nullopt, "header JSON nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    }
    if (enclosing_keys.empty()) fail(file, key, "appears twice in the header (duplicate key '" + key + "')");
    if (enclosing_keys.front() == "__metadata__") fail(file, std::nullopt, "__metadata__ gives key '" + key + "' twice");
    fail(file, enclosing_keys.front(), "its entry gives \"" + key + "\" twice");
  };
  try {
    return detail::parse_json_strictly(text, kMaxJsonDepth, on_problem);
  } catch (const json::exception& e) {
    fail(file, std::nullopt, std::string("header is not valid JSON: ") + e.what());
  }
}

uint64_t unsigned_value(const std::string& file, const std::string& tensor, const json& value, const char* what) {
  if (!value.is_number_unsigned()) fail(file, tensor, std::string(what) + " must be non-negative integers, got " + value.dump());
  return value.get<uint64_t>();
}

TensorRecord parse_tensor(const std::string& file, const std::string& name, const json& value) {
  if (!value.is_object()) fail(file, name, "entry must be an object, got " + value.dump());
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(field)) fail(file, name, std::string("entry lacks \"") + field + "\"");
  }
  TensorRecord record;
  record.name = name;
  const json& dtype = value["dtype"];
  if (!dtype.is_string()) fail(file, name, "dtype must be a string, got " + dtype.dump());
  try {
    record.dtype = dtype_from_safetensors(dtype.get<std::string>());
  } catch (const c10::Error& e) {
    fail(file, name, e.msg());
  }
  const json& shape = value["shape"];
  if (!shape.is_array()) fail(file, name, "shape must be an array, got " + shape.dump());
  uint64_t elements = 1;
  // torch gives every tensor strides, products of the sizes with zeros taken as ones, so an empty
  // tensor of huge dimensions ([0, 2^62, 2^62]) has none it can hold, though it has no elements.
  uint64_t stride_span = 1;
  for (const json& dim : shape) {
    const uint64_t size = unsigned_value(file, name, dim, "shape entries");
    if (size > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(elements, size, &elements)) {
      fail(file, name, "shape " + shape.dump() + " has more elements than 64 bits can count");
    }
    if (__builtin_mul_overflow(stride_span, std::max<uint64_t>(size, 1), &stride_span) ||
        stride_span > static_cast<uint64_t>(INT64_MAX)) {
      fail(file, name, "shape " + shape.dump() + " has dimensions whose product 64 bits cannot count, so torch " +
                           "cannot give it strides (even with no elements)");
    }
    record.shape.push_back(static_cast<int64_t>(size));
  }
  const int64_t packed = values_per_element(record.dtype);
  if (packed > 1) {  // F4: the shape counts values, torch's element holds `packed` of them
    if (record.shape.empty() || record.shape.back() % packed != 0) {
      fail(file, name, "shape " + shape.dump() + " of " + dtype.get<std::string>() + " must have a last dimension " +
                           "divisible by " + std::to_string(packed) + " (the values a byte holds)");
    }
    record.shape.back() /= packed;
    elements /= static_cast<uint64_t>(packed);
  }
  const json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) fail(file, name, "data_offsets must be [begin, end], got " + offsets.dump());
  record.begin = unsigned_value(file, name, offsets[0], "data_offsets");
  record.end = unsigned_value(file, name, offsets[1], "data_offsets");
  if (record.begin > record.end) fail(file, name, "data_offsets " + offsets.dump() + " end before they begin");
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(elements, static_cast<uint64_t>(c10::elementSize(record.dtype)), &bytes)) {
    fail(file, name, "shape " + shape.dump() + " needs more bytes than 64 bits can count");
  }
  if (bytes != record.end - record.begin) {
    fail(file, name, "shape " + shape.dump() + " of " + dtype.get<std::string>() + " needs " + std::to_string(bytes) +
                         " bytes but data_offsets " + offsets.dump() + " span " + std::to_string(record.end - record.begin));
  }
  return record;
}

}  // namespace

ParsedHeader parse_header(const std::string& file, std::string_view header, uint64_t data_bytes) {
  const json root = parse_strictly(file, header);
  if (!root.is_object()) fail(file, std::nullopt, "header must be a JSON object");
  ParsedHeader parsed;
  for (const auto& [name, value] : root.items()) {
    if (name == "__metadata__") {
      if (value.is_null()) continue;  // the safetensors package reads null as no metadata, and so do we
      if (!value.is_object()) fail(file, std::nullopt, "__metadata__ must be an object of strings");
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) fail(file, std::nullopt, "__metadata__ value for '" + key + "' must be a string, got " + text.dump());
        parsed.metadata[key] = text.get<std::string>();
      }
      continue;
    }
    // An empty name is a name: the safetensors package writes and reads it, and so do we.
    parsed.records.push_back(parse_tensor(file, name, value));
  }
  // The tensors must tile the data section exactly: no holes, no overlaps, nothing left over.
  std::stable_sort(parsed.records.begin(), parsed.records.end(), [](const TensorRecord& a, const TensorRecord& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (const TensorRecord& record : parsed.records) {
    if (record.begin > covered) {
      fail(file, record.name, "leaves a hole: the data before it ends at byte " + std::to_string(covered) +
                                  " but it begins at " + std::to_string(record.begin));
    }
    if (record.begin < covered) {
      fail(file, record.name, "overlaps the tensor before it (begins at " + std::to_string(record.begin) +
                                  ", previous data ends at " + std::to_string(covered) + ")");
    }
    covered = record.end;
  }
  if (covered != data_bytes) {
    fail(file, std::nullopt, "the data section holds " + std::to_string(data_bytes) + " bytes but the tensors cover " +
                       std::to_string(covered) + (covered > data_bytes ? " (file truncated?)" : " (trailing bytes)"));
  }
  return parsed;
}

}  // namespace torchbridge::checkpoint
