// Block caching in the spirit of CUDA's caching allocator, kept small:
//  - sizes round up to 512 B; requests <= 1 MiB come from 2 MiB "small" segments, larger ones
//    from 20 MiB segments (or their own segment, rounded to 2 MiB, past 10 MiB);
//  - free blocks are cached per (device, pool, stream) and split / re-merged with neighbours;
//  - a block used on other streams (recordStream), or freed while its own stream still has work
//    queued, is reused only after events recorded on those streams at free time have completed;
//  - on out-of-memory the cache is released and the allocation retried once before raising;
//  - a per-process memory fraction caps reserved bytes per device, as CUDA's allocator does
//    (torch.cuda.set_per_process_memory_fraction): a segment past the cap counts as out of memory.
#include "sdk/caching_allocator.h"

#include "sdk/runtime_handle.h"
#include "sdk/stream_registry.h"

#include <torchbridge/sdk/device.h>

#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchbridge::sdk {
namespace {

using c10::CachingAllocator::StatType;
using DeviceStats = c10::CachingDeviceAllocator::DeviceStats;

constexpr size_t kMinBlockSize = 512;
constexpr size_t kSmallSize = 1 << 20;
constexpr size_t kSmallSegment = 2 << 20;
constexpr size_t kLargeSegment = 20 << 20;
constexpr size_t kMinLargeAlloc = 10 << 20;
constexpr size_t kRoundLarge = 2 << 20;

struct Block {
  c10::DeviceIndex device = 0;
  c10::StreamId stream = 0;
  size_t size = 0;
  size_t requested = 0;
  char* ptr = nullptr;
  bool small = false;
  bool allocated = false;
  Block* prev = nullptr;  // neighbours inside the same segment
  Block* next = nullptr;
  // Streams that use this memory besides the allocating one (record_stream), and the allocating
  // one itself when the block is freed while that stream is busy (free), as (device, stream id):
  // stream ids are numbered per device, so a stream of another device is named with its device.
  std::set<std::pair<c10::DeviceIndex, c10::StreamId>> stream_uses;
};

struct BlockOrder {
  bool operator()(const Block* a, const Block* b) const {
    return std::tie(a->stream, a->size, a->ptr) < std::tie(b->stream, b->size, b->ptr);
  }
};
using Pool = std::set<Block*, BlockOrder>;

struct PendingFree {
  Block* block;
  std::vector<tb_event> events;
};

struct DeviceState {
  Pool small_free;
  Pool large_free;
  std::unordered_map<const void*, Block*> live;
  std::vector<PendingFree> pending;
  DeviceStats stats;
  double fraction = 1.0;
  std::optional<size_t> limit_bytes;  // fraction * total memory, once a fraction was set
};

size_t round_size(size_t bytes) { return (bytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize; }

size_t segment_size(size_t size) {
  if (size <= kSmallSize) return kSmallSegment;
  if (size < kMinLargeAlloc) return kLargeSegment;
  return (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

void update(c10::CachingAllocator::StatArray& stat, bool small, int64_t amount) {
  for (const StatType type : {StatType::AGGREGATE, small ? StatType::SMALL_POOL : StatType::LARGE_POOL}) {
    auto& s = stat[static_cast<size_t>(type)];
    if (amount >= 0) s.increase(static_cast<size_t>(amount));
    else s.decrease(static_cast<size_t>(-amount));
  }
}

void delete_block(void* context);

// Whether the stream has run everything queued on it. Called in deleters, which must not raise: a
// failed query warns and counts as busy, so the caller waits for the stream. Without a usable
// runtime (none registered, or a forked child, which inherits the parent's tensors but none of its
// queued work) nothing can still be queued.
bool stream_idle(c10::DeviceIndex device, c10::StreamId id) {
  if (!has_runtime() || in_bad_fork()) return true;
  try {
    const c10::Stream stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), id);
    const tb_status status = runtime().table().stream_query(runtime().context(), native_stream(stream));
    if (status == TB_SUCCESS) return true;
    if (status != TB_ERROR_NOT_READY) runtime().warn_unless_success(status, "stream_query");
  } catch (const c10::Error& e) {
    TORCH_WARN("device '", runtime().name(), "': cannot ask whether stream ", id, " of device ", int(device),
               " is idle (", e.what_without_backtrace(), "); a block freed on it waits for it");
  }
  return false;
}

template <typename Fn>
void for_each_stat(DeviceStats& s, Fn&& fn) {
  for (auto* array : {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
                      &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes}) {
    for (auto& stat : *array) fn(stat);
  }
}

class SdkCachingAllocator final : public CachingAllocator {
 public:
  void init(int device_count) override {
    std::lock_guard<std::mutex> lock(mutex_);
    devices_.resize(device_count);
  }

  c10::DataPtr allocate(size_t bytes) override {
    int32_t current = 0;
    TB_CALL(get_device, &current);
    const auto device = static_cast<c10::DeviceIndex>(current);
    const c10::Device torch_device(c10::DeviceType::PrivateUse1, device);
    if (bytes == 0) return c10::DataPtr(nullptr, nullptr, &delete_block, torch_device);
    const c10::StreamId stream = current_stream(device).id();

    std::lock_guard<std::mutex> lock(mutex_);
    DeviceState& state = state_of(device);
    process_pending(state, /*wait=*/false);
    const size_t size = round_size(bytes);
    const bool small = size <= kSmallSize;
    Pool& pool = small ? state.small_free : state.large_free;

    Block* block = take_cached(state, pool, stream, size);
    if (block == nullptr) block = new_segment(state, device, stream, size, small, bytes);
    split(state, pool, block, size);

    block->allocated = true;
    block->requested = bytes;
    state.live[block->ptr] = block;
    update(state.stats.allocation, small, 1);
    update(state.stats.allocated_bytes, small, static_cast<int64_t>(block->size));
    update(state.stats.active, small, 1);
    update(state.stats.active_bytes, small, static_cast<int64_t>(block->size));
    update(state.stats.requested_bytes, small, static_cast<int64_t>(bytes));
    return c10::DataPtr(block->ptr, block, &delete_block, torch_device);
  }

  void free(Block* block) {
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceState& state = state_of(block->device);
    state.live.erase(block->ptr);
    update(state.stats.allocation, block->small, -1);
    update(state.stats.allocated_bytes, block->small, -static_cast<int64_t>(block->size));
    block->allocated = false;
    // Work queued on the block's own stream before this free (an asynchronous copy or memset) may
    // still read or write it. CUDA's allocator hands such a block out at once, since whatever its
    // next owner does is queued behind that work; here the next owner may be a kernel run on the
    // host (the CPU fallback), on another thread, at once. So while that stream is busy, the block
    // waits for it as for any other stream that used it.
    if (!stream_idle(block->device, block->stream)) block->stream_uses.emplace(block->device, block->stream);
    if (block->stream_uses.empty()) {
      return_to_pool(state, block);
      return;
    }
    // Streams may still read or write this memory: reuse it only after they pass here.
    // This runs in a deleter, inside a destructor: a runtime failure must not raise. Without an
    // event the block waits for its streams right here; if even that fails, it is never reused.
    PendingFree pending{block, {}};
    bool fenced = true;
    for (const auto& [device, id] : block->stream_uses) {
      const c10::Stream stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), id);
      if (tb_event event = runtime().create_event_or_warn(device, 0)) {
        if (TB_CALL_OR_WARN(event_record, event, native_stream(stream))) {
          pending.events.push_back(event);
          continue;
        }
        TB_CALL_OR_WARN(event_destroy, event);
      }
      fenced = TB_CALL_OR_WARN(stream_synchronize, native_stream(stream)) && fenced;
    }
    block->stream_uses.clear();
    if (!fenced) {
      TORCH_WARN("device '", runtime().name(), "': ", block->size, " bytes at ", static_cast<void*>(block->ptr),
                 " stay unused for the rest of the process: another stream may still use them and the "
                 "runtime could neither record an event nor synchronize that stream");
      for (tb_event event : pending.events) TB_CALL_OR_WARN(event_destroy, event);
      return;
    }
    if (pending.events.empty()) {
      return_to_pool(state, block);
      return;
    }
    state.pending.push_back(std::move(pending));
  }

  c10::DeleterFnPtr raw_deleter() const override { return &delete_block; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    TB_CALL(memcpy_sync, dest, src, count, TB_MEMCPY_DEVICE_TO_DEVICE);
  }

  bool initialized() override { return has_runtime(); }

  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t d = 0; d < devices_.size(); ++d) release_cached(devices_[d], static_cast<c10::DeviceIndex>(d));
  }

  void recordStream(const c10::DataPtr& data_ptr, c10::Stream stream) override {
    if (data_ptr.get() == nullptr || data_ptr.get_deleter() != &delete_block) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto* block = static_cast<Block*>(data_ptr.get_context());
    if (stream.device_index() != block->device || stream.id() != block->stream) {
      block->stream_uses.emplace(stream.device_index(), stream.id());
    }
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    // As torch.cuda's: a free waiting for streams stays active until the allocator next looks (an
    // allocation, empty_cache), even once those streams have passed.
    return state_of(device).stats;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceStats& s = state_of(device).stats;
    for_each_stat(s, [](c10::CachingAllocator::Stat& stat) { stat.reset_accumulated(); });
    s.num_alloc_retries = 0;
    s.num_ooms = 0;
    s.num_device_alloc = 0;
    s.num_device_free = 0;
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for_each_stat(state_of(device).stats, [](c10::CachingAllocator::Stat& stat) { stat.reset_peak(); });
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    const tb_device_properties props = runtime().properties(device);
    return {props.free_memory_bytes, props.total_memory_bytes};
  }

  void set_memory_fraction(double fraction, c10::DeviceIndex device) override {
    TORCH_CHECK_VALUE(std::isfinite(fraction) && fraction >= 0.0 && fraction <= 1.0, "memory fraction ", fraction,
                      " is invalid: expected a number from 0 to 1 (the share of device ", int(device),
                      "'s memory this process may reserve)");
    const size_t total = runtime().properties(device).total_memory_bytes;
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceState& state = state_of(device);
    state.fraction = fraction;
    // CUDA's allocator rounds the cap the same way: whole bytes, down.
    state.limit_bytes = static_cast<size_t>(fraction * static_cast<double>(total));
  }

  double memory_fraction(c10::DeviceIndex device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return state_of(device).fraction;
  }

  std::optional<c10::DeviceIndex> device_of(const void* pointer) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const char* p = static_cast<const char*>(pointer);
    for (size_t d = 0; d < devices_.size(); ++d) {
      for (const auto& [start, block] : devices_[d].live) {
        if (p >= block->ptr && p < block->ptr + block->size) return static_cast<c10::DeviceIndex>(d);
      }
    }
    return std::nullopt;
  }

 private:
  DeviceState& state_of(c10::DeviceIndex device) {
    TORCH_CHECK_INDEX(device >= 0 && static_cast<size_t>(device) < devices_.size(), "device index ",
                      int(device), " is out of range for '", runtime().name(), "' (", devices_.size(),
                      " devices)");
    return devices_[device];
  }

  // A cached block that is part of a split segment is an inactive split, as torch.cuda counts them
  // (inactive_split, inactive_split_bytes): counted as such a block enters a pool, and uncounted
  // as it leaves (taken for an allocation, merged into a neighbour).
  static void count_inactive_split(DeviceState& state, const Block* block, int direction) {
    if (block->prev == nullptr && block->next == nullptr) return;
    update(state.stats.inactive_split, block->small, direction);
    update(state.stats.inactive_split_bytes, block->small, direction * static_cast<int64_t>(block->size));
  }

  static void pool_insert(DeviceState& state, Pool& pool, Block* block) {
    pool.insert(block);
    count_inactive_split(state, block, 1);
  }

  static void pool_erase(DeviceState& state, Pool& pool, Block* block) {
    pool.erase(block);
    count_inactive_split(state, block, -1);
  }

  static Block* take_cached(DeviceState& state, Pool& pool, c10::StreamId stream, size_t size) {
    Block key;
    key.stream = stream;
    key.size = size;
    auto it = pool.lower_bound(&key);
    if (it == pool.end() || (*it)->stream != stream) return nullptr;
    Block* block = *it;
    pool_erase(state, pool, block);
    return block;
  }

  Block* new_segment(DeviceState& state, c10::DeviceIndex device, c10::StreamId stream, size_t size,
                     bool small, size_t requested) {
    const size_t bytes = segment_size(size);
    void* ptr = nullptr;
    tb_status status = reserve(state, device, bytes, &ptr);
    if (status == TB_ERROR_OUT_OF_MEMORY) {
      // Give every cached byte back to the device and try once more.
      state.stats.num_alloc_retries += 1;
      release_cached(state, device);
      status = reserve(state, device, bytes, &ptr);
    }
    if (status == TB_ERROR_OUT_OF_MEMORY) {
      state.stats.num_ooms += 1;
      const auto& reserved = state.stats.reserved_bytes[0].current;
      const auto& allocated = state.stats.allocated_bytes[0].current;
      const tb_device_properties props = runtime().properties(device);
      const bool over_fraction = exceeds_fraction(state, bytes);
      // "NAME out of memory. Tried to allocate": the wording of torch's own devices, which libraries
      // match on (accelerate's find_executable_batch_size looks for " out of memory.").
      TORCH_CHECK_WITH(OutOfMemoryError, false, runtime().name(), " out of memory. Tried to allocate ", requested,
                       " bytes on device ", int(device), " (a ", bytes, "-byte segment); the device has ",
                       props.free_memory_bytes, " bytes free of ", props.total_memory_bytes, "; ",
                       reserved - allocated, " bytes are cached but unused after freeing the cache (",
                       allocated, " bytes allocated by tensors). ",
                       over_fraction ? fraction_text(state, reserved) : "Runtime said: " + runtime().describe(status));
    }
    runtime().check(status, "device_malloc");
    runtime().check_allocation(ptr, bytes, "device_malloc");
    state.stats.num_device_alloc += 1;
    update(state.stats.segment, small, 1);
    update(state.stats.reserved_bytes, small, static_cast<int64_t>(bytes));
    auto* block = new Block();
    block->device = device;
    block->stream = stream;
    block->size = bytes;
    block->ptr = static_cast<char*>(ptr);
    block->small = small;
    return block;
  }

  // The runtime's device_malloc, unless the segment would take the device's reserved bytes past
  // the per-process memory fraction (then out of memory without asking the runtime).
  tb_status reserve(DeviceState& state, c10::DeviceIndex device, size_t bytes, void** ptr) {
    if (exceeds_fraction(state, bytes)) return TB_ERROR_OUT_OF_MEMORY;
    return runtime().table().device_malloc(runtime().context(), device, bytes, ptr);
  }

  static bool exceeds_fraction(const DeviceState& state, size_t bytes) {
    if (!state.limit_bytes) return false;
    const auto reserved = static_cast<size_t>(state.stats.reserved_bytes[0].current);
    return reserved > *state.limit_bytes || bytes > *state.limit_bytes - reserved;
  }

  static std::string fraction_text(const DeviceState& state, int64_t reserved) {
    return c10::str("The per-process memory fraction ", state.fraction, " caps this process at ",
                    *state.limit_bytes, " bytes of the device, of which ", reserved,
                    " are reserved (set_per_process_memory_fraction raises the cap).");
  }

  static void split(DeviceState& state, Pool& pool, Block* block, size_t size) {
    const size_t remaining = block->size - size;
    if (block->small ? remaining < kMinBlockSize : remaining <= kSmallSize) return;
    auto* rest = new Block(*block);
    rest->ptr = block->ptr + size;
    rest->size = remaining;
    rest->prev = block;
    rest->next = block->next;
    rest->stream_uses.clear();
    if (rest->next != nullptr) rest->next->prev = rest;
    block->next = rest;
    block->size = size;
    pool_insert(state, pool, rest);
  }

  void return_to_pool(DeviceState& state, Block* block) {
    Pool& pool = block->small ? state.small_free : state.large_free;
    update(state.stats.active, block->small, -1);
    update(state.stats.active_bytes, block->small, -static_cast<int64_t>(block->size));
    // As torch.cuda's free_block: the requested bytes stay counted, like the active ones, while a
    // free waits for the streams recorded on the block (allocated_bytes drops at free).
    update(state.stats.requested_bytes, block->small, -static_cast<int64_t>(block->requested));
    // Merge with free neighbours so the segment can become whole again.
    for (Block* neighbour : {block->prev, block->next}) {
      if (neighbour == nullptr || neighbour->allocated || pool.count(neighbour) == 0) continue;
      pool_erase(state, pool, neighbour);
      if (neighbour == block->prev) {
        block->ptr = neighbour->ptr;
        block->prev = neighbour->prev;
        if (block->prev != nullptr) block->prev->next = block;
      } else {
        block->next = neighbour->next;
        if (block->next != nullptr) block->next->prev = block;
      }
      block->size += neighbour->size;
      delete neighbour;
    }
    pool_insert(state, pool, block);
  }

  void process_pending(DeviceState& state, bool wait) {
    auto it = state.pending.begin();
    while (it != state.pending.end()) {
      bool done = true;
      for (tb_event event : it->events) {
        if (wait) TB_CALL(event_synchronize, event);
        else if (!runtime().event_completed(event)) done = false;
      }
      if (!done) {
        ++it;
        continue;
      }
      for (tb_event event : it->events) TB_CALL_OR_WARN(event_destroy, event);  // a lost event costs nothing
      return_to_pool(state, it->block);
      it = state.pending.erase(it);
    }
  }

  static bool whole_segment(const Block* block) { return block->prev == nullptr && block->next == nullptr; }

  // Gives the device back every cached segment none of whose memory is in use. The device is
  // synchronized first, as cudaFree does: work queued before a block was freed may still read or
  // write it, and a runtime that hands the memory out again at once would put a new segment under
  // that work. Then the frees that waited for other streams (record_stream) join the pools, so
  // their segments go back too.
  void release_cached(DeviceState& state, c10::DeviceIndex device) {
    const auto any_whole = [](const Pool& pool) { return std::any_of(pool.begin(), pool.end(), whole_segment); };
    if (state.pending.empty() && !any_whole(state.small_free) && !any_whole(state.large_free)) return;
    TB_CALL(device_synchronize, device);
    process_pending(state, /*wait=*/true);
    for (Pool* pool : {&state.small_free, &state.large_free}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* block = *it;
        if (!whole_segment(block)) {  // part of a split segment, another part in use
          ++it;
          continue;
        }
        runtime().check(runtime().table().device_free(runtime().context(), block->device, block->ptr), "device_free");
        state.stats.num_device_free += 1;
        update(state.stats.segment, block->small, -1);
        update(state.stats.reserved_bytes, block->small, -static_cast<int64_t>(block->size));
        it = pool->erase(it);
        delete block;
      }
    }
  }

  std::mutex mutex_;
  std::vector<DeviceState> devices_;
};

SdkCachingAllocator& instance() {
  static SdkCachingAllocator* allocator = new SdkCachingAllocator();  // lives until exit, like torch's
  return *allocator;
}

void delete_block(void* context) {
  // In a forked child the memory belongs to the parent's runtime: nothing to give back.
  if (context != nullptr && !in_bad_fork()) instance().free(static_cast<Block*>(context));
}

}  // namespace

CachingAllocator& caching_allocator() { return instance(); }

namespace {

c10::DeviceIndex checked_device(int index, const char* call) {
  TORCH_CHECK(has_runtime(), call, ": no SDK device is registered in this process");
  const int count = runtime().device_count();
  TORCH_CHECK_INDEX(index >= 0 && index < count, call, ": device index ", index, " is out of range for '",
                    runtime().name(), "' (", count, " devices)");
  return static_cast<c10::DeviceIndex>(index);
}

}  // namespace

void set_memory_fraction(double fraction, int index) {
  instance().set_memory_fraction(fraction, checked_device(index, "set_memory_fraction"));
}

double memory_fraction(int index) { return instance().memory_fraction(checked_device(index, "memory_fraction")); }

}  // namespace torchbridge::sdk
