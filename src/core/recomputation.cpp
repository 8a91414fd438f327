#include <torchbridge/recomputation.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <iterator>
#include <memory>
#include <utility>

namespace torchbridge::recomputation {
namespace {

using Phase = RecomputationRecord::Phase;

struct ActiveRegion {
  RecomputationRecord* record;
  Phase phase;
};

// Innermost last. A region whose forward pass raised may leave its scope after a newer one began
// (Python keeps the frame alive in the traceback), so scopes leave by address, not by popping.
thread_local std::vector<ActiveRegion> active_regions;

void enter(RecomputationRecord* record, Phase phase) { active_regions.push_back({record, phase}); }

void leave(RecomputationRecord* record, Phase phase) {
  const auto found = std::find_if(active_regions.rbegin(), active_regions.rend(), [&](const ActiveRegion& region) {
    return region.record == record && region.phase == phase;
  });
  if (found != active_regions.rend()) active_regions.erase(std::next(found).base());
}

// The innermost recomputation's position in the stack, if one is running.
std::optional<std::size_t> innermost_recomputation() {
  for (std::size_t i = active_regions.size(); i-- > 0;) {
    if (active_regions[i].phase == Phase::kRecomputation) return i;
  }
  return std::nullopt;
}

}  // namespace

RecomputationRecord::Scope::Scope(RecomputationRecord& record, Phase phase) : record_(&record), phase_(phase) {
  if (phase_ == Phase::kRecomputation) record_->replayed_.clear();
  enter(record_, phase_);
}
RecomputationRecord::Scope::~Scope() { leave(record_, phase_); }

bool recomputing() { return innermost_recomputation().has_value(); }

std::optional<at::Tensor> replay(const void* key) {
  const std::optional<std::size_t> index = innermost_recomputation();
  if (!index) return std::nullopt;
  RecomputationRecord& region = *active_regions[*index].record;
  const auto values = region.values_.find(key);
  const std::size_t recorded = values == region.values_.end() ? 0 : values->second.size();
  std::size_t& next = region.replayed_[key];
  TORCH_CHECK(next < recorded, "torchbridge checkpoint: a stateful layer (e.g. FP8's delayed scaling) ran ", next + 1,
              " time(s) while its region was recomputed but ", recorded,
              " time(s) in the forward pass; the region must compute the same thing both times");
  return values->second[next++];
}

void record(const void* key, const at::Tensor& value) {
  at::Tensor copy;  // one copy shared by every region: nobody writes to it
  // Every region past the innermost recomputation (all of them when none runs) is in its forward pass.
  const std::optional<std::size_t> recomputation = innermost_recomputation();
  for (std::size_t i = recomputation ? *recomputation + 1 : 0; i < active_regions.size(); ++i) {
    if (!copy.defined()) copy = value.detach().clone();
    active_regions[i].record->values_[key].push_back(copy);
  }
}

}  // namespace torchbridge::recomputation
