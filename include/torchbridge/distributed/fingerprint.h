#pragma once
// A 64-bit fingerprint (FNV-1a) of tensors' dtypes, shapes and bytes, in order: equal fingerprints
// on every rank mean bit-identical parameters, which is what data parallel training promises.

#include <cstdint>
#include <string>
#include <vector>

namespace at {
class Tensor;
}

namespace torchbridge::distributed {

uint64_t fingerprint(const std::vector<at::Tensor>& tensors);
// As 16 hexadecimal digits.
std::string fingerprint_text(uint64_t fingerprint);

}  // namespace torchbridge::distributed
