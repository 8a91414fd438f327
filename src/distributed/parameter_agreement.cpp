#include "distributed/parameter_agreement.h"

#include <torchbridge/distributed/process_group.h>

#include <ATen/ATen.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace torchbridge::distributed {
namespace {

constexpr int64_t kMaxDims = 8;
// A parameter's row: dimensions, dtype, whether it is trained, its device type, sizes. Ranks that
// train different parameters would hand c10d's reducer lists of different lengths (Gloo then
// aborts the process on a size mismatch); ranks on different device types reduce gradients
// differently (host staging averages after the all-reduce, the CPU before it), to wrong numbers.
constexpr int64_t kSizes = 4;
constexpr int64_t kRow = kSizes + kMaxDims;

std::string describe(const at::Tensor& row) {
  std::ostringstream text;
  text << static_cast<at::ScalarType>(row[1].item<int64_t>()) << " [";
  for (int64_t d = 0; d < row[0].item<int64_t>(); ++d) text << (d ? ", " : "") << row[d + kSizes].item<int64_t>();
  text << "] " << (row[2].item<int64_t>() != 0 ? "trained" : "frozen") << " on "
       << c10::DeviceTypeName(static_cast<c10::DeviceType>(row[3].item<int64_t>()), /*lower_case=*/true);
  return text.str();
}

}  // namespace

void check_together(ProcessGroup& group, const std::string& who, const std::function<void()>& local_checks) {
  std::exception_ptr own;
  std::string refusal;
  try {
    local_checks();
  } catch (const c10::Error& e) {
    own = std::current_exception();
    refusal = e.what_without_backtrace();
  } catch (const std::exception& e) {
    own = std::current_exception();
    refusal = e.what();
  }
  // A refusal with no text would read as none.
  if (own && refusal.empty()) refusal = who + ": an error without a message";
  try {
    group.refuse_together(who, refusal);
  } catch (const c10::ValueError&) {
    if (own) std::rethrow_exception(own);
    throw;
  }
}

void check_same_parameters_on_every_rank(ProcessGroup& group,
                                         const std::vector<std::pair<std::string, at::Tensor>>& parameters,
                                         const std::string& who) {
  const auto count = static_cast<int64_t>(parameters.size());
  check_together(group, who, [&] {
    for (const auto& [name, p] : parameters) {
      TORCH_CHECK_VALUE(p.dim() <= kMaxDims, who, ": parameter '", name, "' has ", p.dim(), " dimensions; at most ",
                        kMaxDims, " are supported");
    }
  });
  const auto counts = group.all_gather(at::full({1}, count, at::kLong));
  std::vector<int64_t> differing;
  std::string first_difference;
  for (size_t r = 1; r < counts.size(); ++r) {
    const int64_t theirs = counts[r].item<int64_t>(), zeros = counts[0].item<int64_t>();
    if (theirs == zeros) continue;
    differing.push_back(static_cast<int64_t>(r));
    if (first_difference.empty()) {
      first_difference = "rank " + std::to_string(r) + " has " + std::to_string(theirs) + " parameters, rank 0 " +
                         std::to_string(zeros);
    }
  }
  if (differing.empty()) {
    at::Tensor metadata = at::zeros({count, kRow}, at::kLong);
    for (int64_t i = 0; i < count; ++i) {
      const at::Tensor& p = parameters[static_cast<size_t>(i)].second;
      metadata[i][0] = p.dim();
      metadata[i][1] = static_cast<int64_t>(p.scalar_type());
      metadata[i][2] = p.requires_grad() ? 1 : 0;
      metadata[i][3] = static_cast<int64_t>(p.device().type());
      for (int64_t d = 0; d < p.dim(); ++d) metadata[i][d + kSizes] = p.size(d);
    }
    const auto all = group.all_gather(metadata);
    for (size_t r = 1; r < all.size(); ++r) {
      if (at::equal(all[r], all[0])) continue;
      differing.push_back(static_cast<int64_t>(r));
      if (!first_difference.empty()) continue;
      for (int64_t i = 0; i < count; ++i) {
        if (at::equal(all[r][i], all[0][i])) continue;
        first_difference = "parameter '" + parameters[static_cast<size_t>(i)].first + "' is " + describe(all[r][i]) +
                           " on rank " + std::to_string(r) + ", " + describe(all[0][i]) + " on rank 0";
        break;
      }
    }
  }
  TORCH_CHECK_VALUE(differing.empty(), who, ", rank ", group.rank(), " of ", group.world_size(),
                    ": the model differs across ranks (ranks ", c10::IntArrayRef(differing),
                    " do not match rank 0's parameters): ", first_difference);
}

}  // namespace torchbridge::distributed
