#pragma once
// Which rank was lost, when a collective fails. Gloo reports only what this rank saw ("Connection
// closed by peer", "Timed out waiting"), with an address that names no rank, and a peer's failure
// can reach a rank only through a survivor that gave up. So every rank of a launched world beats
// a counter in the rendezvous store from a thread of its own; after a failure, counters that stop
// moving are the ranks whose process died or stopped. Internal to the distributed layer.

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace c10d {
class Store;
}

namespace torchbridge::distributed {

struct LaunchEnvironment;

class Liveness {
 public:
  // `store` is the job's rendezvous store; the heartbeat and the diagnosis each use a connection
  // of their own (clone()), as a TCPStore client serves one caller at a time. A beat every
  // `period`.
  Liveness(const c10::intrusive_ptr<c10d::Store>& store, const LaunchEnvironment& environment,
           std::chrono::milliseconds period);
  ~Liveness();
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // One sentence for an error message: which ranks stopped beating, or that all are alive. The
  // first rank to ask decides (it watches the counters for three periods) and records its answer
  // in the store, so ranks that fail later because a survivor gave up name the same lost rank,
  // not that survivor. The heartbeat thread also copies a recorded answer, so it survives the
  // store: rank 0 serves it and exits once it has failed (it lingers two beats, for the copies).
  // Never throws: an unreachable store with no answer copied is itself the answer.
  std::string diagnose();

 private:
  void beat_until_stopped();
  // The verdict in the store, or this rank's own after watching the heartbeats (then recorded).
  std::string recorded_or_new_verdict();

  c10::intrusive_ptr<c10d::Store> beats_;      // the heartbeat thread's connection
  c10::intrusive_ptr<c10d::Store> diagnosis_;  // the failing caller's connection
  int rank_;
  int world_size_;
  bool store_served_by_rank_zero_;
  std::string store_address_;
  std::chrono::milliseconds period_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::mutex verdict_mutex_;
  std::string verdict_;  // the first diagnosis recorded in the store, once seen
  std::thread thread_;
};

// The heartbeat period for a collective timeout: a twentieth of it, between 100 ms and 1 s, so
// the diagnosis (three periods) fits well inside the timeout.
std::chrono::milliseconds heartbeat_period(std::chrono::milliseconds timeout);

}  // namespace torchbridge::distributed
