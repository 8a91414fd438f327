// Live streams and events, keyed by the opaque handle given to the caller.
//
// A handle is a number from a counter that never repeats, not the object's address: a destroyed
// handle therefore can never alias a newer object that happens to reuse the address, and a
// dangling or made-up handle is simply not found (TB_ERROR_INVALID_HANDLE) instead of being
// dereferenced. Lookups hand out shared_ptr, so an object stays alive while any call still uses
// it even if another thread destroys its handle meanwhile.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchbridge::emu {

// Shared by all registries so a stream handle is never also a valid event handle.
inline std::uintptr_t next_handle_value() {
  // Start far from 0 so NULL and small integers passed by mistake are never valid handles.
  static std::atomic<std::uintptr_t> counter{0x10000};
  return counter.fetch_add(1, std::memory_order_relaxed);
}

template <typename Object>
class HandleRegistry {
 public:
  std::uintptr_t add(std::shared_ptr<Object> object) {
    const std::uintptr_t handle = next_handle_value();
    std::lock_guard lock(mutex_);
    objects_.emplace(handle, std::move(object));
    return handle;
  }

  std::shared_ptr<Object> find(std::uintptr_t handle) const {
    std::lock_guard lock(mutex_);
    const auto it = objects_.find(handle);
    return it == objects_.end() ? nullptr : it->second;
  }

  // Removes and returns the object; nullptr if the handle is not live. Exactly one caller wins.
  std::shared_ptr<Object> remove(std::uintptr_t handle) {
    std::lock_guard lock(mutex_);
    const auto it = objects_.find(handle);
    if (it == objects_.end()) return nullptr;
    std::shared_ptr<Object> object = std::move(it->second);
    objects_.erase(it);
    return object;
  }

  std::vector<std::shared_ptr<Object>> snapshot() const {
    std::lock_guard lock(mutex_);
    std::vector<std::shared_ptr<Object>> objects;
    objects.reserve(objects_.size());
    for (const auto& [handle, object] : objects_) objects.push_back(object);
    return objects;
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<std::uintptr_t, std::shared_ptr<Object>> objects_;
};

}  // namespace torchbridge::emu
