#include "sdk/host_allocator.h"

#include "sdk/runtime_handle.h"
#include "sdk/stream_registry.h"

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/DeviceType.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace torchbridge::sdk {
namespace {

constexpr size_t kFirstPrune = 32;

struct HostBlock {
  size_t size = 0;
  bool freed = false;              // the tensor let go; waiting for its events
  std::vector<tb_event> uses;      // recorded after each non_blocking copy touching it
  size_t prune_at = kFirstPrune;   // uses.size() at which completed events are dropped
};

void delete_host_block(void* pointer);

class SdkHostAllocator final : public HostAllocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    reap();
    void* pointer = nullptr;
    if (bytes > 0) {
      const auto start = std::chrono::steady_clock::now();
      TB_CALL(host_malloc, bytes, &pointer);
      runtime().check_allocation(pointer, bytes, "host_malloc");
      stats_.host_alloc_time.increase(microseconds_since(start));
      blocks_[static_cast<char*>(pointer)] = HostBlock{bytes, false, {}, kFirstPrune};
      count_allocation(bytes);
    }
    return c10::DataPtr(pointer, pointer, &delete_host_block, c10::Device(c10::kCPU));
  }

  c10::DeleterFnPtr raw_deleter() const override { return &delete_host_block; }

  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

  bool is_pinned(const void* pointer) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return find(pointer) != blocks_.end();
  }

  void record_use(const void* pointer, const c10::Stream& stream) override { keep_until_done(pointer, stream); }

  // torch's name for record_use; `context` is the DataPtr's, which for these blocks is the pointer.
  bool record_event(void* pointer, void* /*context*/, c10::Stream stream) override {
    return keep_until_done(pointer, stream);
  }

  // Freed blocks are returned to the runtime as soon as their copies complete, so nothing waits in
  // a cache; what this returns is every freed block whose copies have completed since.
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    reap();
  }

  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* stat : counted_stats()) stat->reset_accumulated();
    stats_.host_alloc_time.reset_accumulated();
    stats_.host_free_time.reset_accumulated();
    stats_.num_host_alloc = 0;
    stats_.num_host_free = 0;
    std::fill(stats_.bucket_allocation.begin(), stats_.bucket_allocation.end(), 0);
  }

  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* stat : counted_stats()) stat->reset_peak();
    stats_.host_alloc_time.reset_peak();
    stats_.host_free_time.reset_peak();
  }

  void release(void* pointer) {
    if (pointer == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find(static_cast<char*>(pointer));
    if (it == blocks_.end()) return;
    it->second.freed = true;
    stats_.active_requests.decrease(1);
    stats_.active_bytes.decrease(it->second.size);
    reap();
  }

 private:
  // Whether `pointer` lies in a live block, which then waits for the work queued on `stream`.
  bool keep_until_done(const void* pointer, const c10::Stream& stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = find(pointer);
    if (it == blocks_.end()) return false;
    // A pinned buffer that lives on (a staging buffer reused for every batch) would otherwise keep
    // one event per copy: 200,000 copies held 53 MiB, and every allocation walked them all.
    // Completed events are dropped whenever the list doubles, so each copy pays O(1) on average.
    HostBlock& block = it->second;
    if (block.uses.size() >= block.prune_at) {
      std::erase_if(block.uses, [](tb_event done) {
        if (!completed_without_raising(done)) return false;
        TB_CALL_OR_WARN(event_destroy, done);
        return true;
      });
      block.prune_at = std::max(kFirstPrune, 2 * block.uses.size());
    }
    const tb_event event = runtime().create_event(stream.device_index(), 0);
    TB_CALL(event_record, event, native_stream(stream));
    block.uses.push_back(event);
    return true;
  }

  // The block and byte counts, which the reset methods reset alike.
  std::array<c10::CachingAllocator::Stat*, 4> counted_stats() {
    return {&stats_.active_requests, &stats_.active_bytes, &stats_.allocations, &stats_.allocated_bytes};
  }

  static int64_t microseconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count();
  }

  // As torch's caching host allocators count: a block is active from its allocation to its free,
  // and held from the runtime (allocations, allocated_bytes) until it is returned.
  void count_allocation(size_t bytes) {
    ++stats_.num_host_alloc;
    for (auto* stat : {&stats_.active_requests, &stats_.allocations}) stat->increase(1);
    for (auto* stat : {&stats_.active_bytes, &stats_.allocated_bytes}) stat->increase(bytes);
    // torch's buckets are powers of two, indexed by the bits a block's size needs.
    const size_t bucket = std::min<size_t>(std::bit_width(bytes - 1), stats_.bucket_allocation.size() - 1);
    ++stats_.bucket_allocation[bucket];
  }

  std::map<char*, HostBlock>::iterator find(const void* pointer) {
    const char* p = static_cast<const char*>(pointer);
    auto it = blocks_.upper_bound(const_cast<char*>(p));
    if (it == blocks_.begin()) return blocks_.end();
    --it;
    return p < it->first + it->second.size && !it->second.freed ? it : blocks_.end();
  }

  // reap() also runs from the deleter, which must not raise: a failed query warns and counts as
  // pending, so a block a copy may still read is never handed back.
  static bool completed_without_raising(tb_event event) {
    const tb_status status = runtime().table().event_query(runtime().context(), event);
    if (status == TB_ERROR_NOT_READY) return false;
    return runtime().warn_unless_success(status, "event_query");
  }

  // Returns freed blocks whose recorded copies have all completed to the runtime.
  void reap() {
    for (auto it = blocks_.begin(); it != blocks_.end();) {
      HostBlock& block = it->second;
      const bool idle = block.freed && std::all_of(block.uses.begin(), block.uses.end(), completed_without_raising);
      if (!idle) {
        ++it;
        continue;
      }
      for (tb_event event : block.uses) TB_CALL_OR_WARN(event_destroy, event);
      const auto start = std::chrono::steady_clock::now();
      TB_CALL_OR_WARN(host_free, it->first);
      stats_.host_free_time.increase(microseconds_since(start));
      ++stats_.num_host_free;
      stats_.allocations.decrease(1);
      stats_.allocated_bytes.decrease(block.size);
      it = blocks_.erase(it);
    }
  }

  std::mutex mutex_;
  std::map<char*, HostBlock> blocks_;
  at::HostStats stats_;
};

SdkHostAllocator& instance() {
  static auto* allocator = new SdkHostAllocator();
  return *allocator;
}

void delete_host_block(void* pointer) {
  if (!in_bad_fork()) instance().release(pointer);  // a forked child owns none of it
}

}  // namespace

HostAllocator& host_allocator() { return instance(); }

void register_host_allocator() { at::setHostAllocator(c10::DeviceType::PrivateUse1, &instance()); }

}  // namespace torchbridge::sdk
