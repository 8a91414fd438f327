// torchbridge._C recomputation: a RecomputationRecord's two scopes as Python context managers, so
// torch.utils.checkpoint (context_fn) records and replays what stateful layers (FP8's delayed
// scaling) used, as torchbridge.memory.checkpoint's C++ regions do (include/torchbridge/recomputation.h).
#include <torchbridge/recomputation.h>

#include <c10/util/Exception.h>

#include <pybind11/pybind11.h>

#include <array>  // pybind11::make_tuple
#include <memory>
#include <thread>
#include <utility>

namespace py = pybind11;

namespace torchbridge::python {
namespace {

using recomputation::RecomputationRecord;

// One phase of a shared record. torch.utils.checkpoint enters the recomputation scope once per
// recomputation (again after retain_graph), so a scope may be entered again once it has left.
class RecordScope {
 public:
  RecordScope(std::shared_ptr<RecomputationRecord> record, RecomputationRecord::Phase phase)
      : record_(std::move(record)), phase_(phase) {}

  RecordScope(const RecordScope&) = delete;
  RecordScope& operator=(const RecordScope&) = delete;

  ~RecordScope() {
    if (scope_ && thread_ != std::this_thread::get_id()) {
      // Dropped while active, on another thread: the entering thread's stack still points at the
      // record, so the record and the scope are kept for the rest of the process, not freed.
      TORCH_WARN("torchbridge recomputation scope: released on another thread than it was entered on, without "
                 "leaving; its record is kept for the rest of the process");
      new std::shared_ptr<RecomputationRecord>(record_);  // NOLINT: deliberately never deleted
      static_cast<void>(scope_.release());
    }
  }

  void enter() {
    TORCH_CHECK(!scope_, "torchbridge recomputation scope: entered again before it left");
    scope_ = std::make_unique<RecomputationRecord::Scope>(*record_, phase_);
    thread_ = std::this_thread::get_id();
  }

  void leave() {
    if (!scope_) return;
    // The active regions are a per-thread stack: leaving from another thread would leave this
    // record on the first thread's stack after the record is gone.
    TORCH_CHECK(thread_ == std::this_thread::get_id(),
                "torchbridge recomputation scope: left on another thread than it was entered on");
    scope_.reset();
  }

 private:
  std::shared_ptr<RecomputationRecord> record_;
  RecomputationRecord::Phase phase_;
  std::unique_ptr<RecomputationRecord::Scope> scope_;
  std::thread::id thread_;
};

}  // namespace

void bind_recomputation(py::module_& m) {
  py::class_<RecordScope, std::shared_ptr<RecordScope>>(m, "_RecomputationScope")
      .def("__enter__", [](RecordScope& self) { self.enter(); })
      .def("__exit__", [](RecordScope& self, const py::args&) {
        self.leave();
        return false;  // exceptions raised in the scope propagate
      });

  m.def(
      "_recomputation_scopes",
      []() {
        auto record = std::make_shared<RecomputationRecord>();
        return py::make_tuple(std::make_shared<RecordScope>(record, RecomputationRecord::Phase::kForwardPass),
                              std::make_shared<RecordScope>(record, RecomputationRecord::Phase::kRecomputation));
      },
      "(forward pass scope, recomputation scope) over one new record: torch.utils.checkpoint's context_fn.");

  m.def("_recomputing", &recomputation::recomputing,
        "Whether a recorded region is being recomputed on this thread.");
}

}  // namespace torchbridge::python
