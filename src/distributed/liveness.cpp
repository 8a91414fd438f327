#include "distributed/liveness.h"

#include "distributed/failure_cause.h"

#include <torchbridge/distributed/launch_environment.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

namespace torchbridge::distributed {
namespace {

std::string beat_key(int rank) { return "beat/" + std::to_string(rank); }
std::string finished_key(int rank) { return "finished/" + std::to_string(rank); }
const std::string kVerdictKey = "verdict";

std::vector<int64_t> read_beats(c10d::Store& store, int world_size) {
  std::vector<int64_t> beats;
  for (int r = 0; r < world_size; ++r) beats.push_back(store.add(beat_key(r), 0));  // add 0: read, creating if absent
  return beats;
}

std::string list_of_ranks(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  return text;
}

}  // namespace

std::chrono::milliseconds heartbeat_period(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 20, std::chrono::milliseconds(100), std::chrono::milliseconds(1000));
}

Liveness::Liveness(const c10::intrusive_ptr<c10d::Store>& store, const LaunchEnvironment& environment,
                   std::chrono::milliseconds period)
    : rank_(environment.rank),
      world_size_(environment.world_size),
      store_served_by_rank_zero_(!environment.agent_store),
      store_address_(environment.master_addr + ":" + std::to_string(environment.master_port)),
      period_(period) {
  // A restarted job (torchelastic) shares the agent's store with its earlier attempts.
  const std::string prefix = "liveness/" + std::to_string(environment.restart_count.value_or(0));
  beats_ = c10::make_intrusive<c10d::PrefixStore>(prefix, store->clone());
  diagnosis_ = c10::make_intrusive<c10d::PrefixStore>(prefix, store->clone());
  beats_->add(beat_key(rank_), 1);
  thread_ = std::thread([this] { beat_until_stopped(); });
}

Liveness::~Liveness() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  try {
    beats_->set(finished_key(rank_), std::vector<uint8_t>{1});  // a rank that ended on purpose is not lost
  } catch (const std::exception&) {
    // the store is already gone: nobody is left to ask
  }
}

void Liveness::beat_until_stopped() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, period_, [this] { return stopping_; })) {
    try {
      beats_->add(beat_key(rank_), 1);
      if (beats_->check({kVerdictKey})) {
        const auto recorded = beats_->get(kVerdictKey);
        const std::lock_guard<std::mutex> verdict_lock(verdict_mutex_);
        verdict_.assign(recorded.begin(), recorded.end());
      }
    } catch (const std::exception&) {
      return;  // the store is gone; the diagnosis will say so
    }
  }
}

std::string Liveness::diagnose() {
  {
    const std::lock_guard<std::mutex> verdict_lock(verdict_mutex_);
    if (!verdict_.empty()) return verdict_;
  }
  try {
    std::string verdict = recorded_or_new_verdict();
    // Rank 0's exit takes the store with it: stay two beats, so every survivor's heartbeat thread
    // copies the verdict first.
    if (rank_ == 0 && store_served_by_rank_zero_) std::this_thread::sleep_for(2 * period_);
    return verdict;
  } catch (const std::exception& e) {
    {
      const std::lock_guard<std::mutex> verdict_lock(verdict_mutex_);
      if (!verdict_.empty()) return verdict_;
    }
    const std::string cause = failure_cause(e);
    if (store_served_by_rank_zero_) {
      return "rank 0 was lost: the rendezvous store it serves at " + store_address_ + " no longer answers (" + cause +
             ")";
    }
    return std::string("the rendezvous store at ") + store_address_ +
           " (torchrun's agent) no longer answers, so no rank can be named: " + cause;
  }
}

std::string Liveness::recorded_or_new_verdict() {
  if (diagnosis_->check({kVerdictKey})) {
    const auto recorded = diagnosis_->get(kVerdictKey);
    return std::string(recorded.begin(), recorded.end());
  }
  const auto before = read_beats(*diagnosis_, world_size_);
  std::this_thread::sleep_for(3 * period_);
  const auto after = read_beats(*diagnosis_, world_size_);
  std::vector<int> lost, finished;
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_ || after[r] != before[r]) continue;
    (diagnosis_->check({finished_key(r)}) ? finished : lost).push_back(r);
  }
  std::string verdict;
  if (!lost.empty()) {
    verdict = list_of_ranks(lost) + (lost.size() == 1 ? " was" : " were") +
              " lost: its heartbeat stopped (the process died or was stopped)";
  } else if (!finished.empty()) {
    // A rank's group ends on purpose when its program finishes, and also when an error unwinds it:
    // this rank cannot tell which.
    verdict = list_of_ranks(finished) + (finished.size() == 1 ? " has" : " have") +
              " left the group while this rank still expected it: its program finished or stopped on an error "
              "(see that rank's output); if it finished, do all ranks run the same number of steps?";
  } else {
    verdict = "every rank is still alive (each beat its heartbeat), so one of them did not enter this operation in "
              "time: do all ranks run the same steps?";
  }
  const std::vector<uint8_t> mine(verdict.begin(), verdict.end());
  const auto recorded = diagnosis_->compareSet(kVerdictKey, {}, mine);  // the first rank's answer wins
  return std::string(recorded.begin(), recorded.end());
}

}  // namespace torchbridge::distributed
