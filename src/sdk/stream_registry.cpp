#include "sdk/stream_registry.h"

#include "sdk/runtime_handle.h"

#include <torchbridge/sdk/device.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace torchbridge::sdk {
namespace {

// The streams of one priority: kStreamPoolSize of them, handed out in turn.
struct PriorityPool {
  std::vector<c10::StreamId> ids;
  size_t next = 0;
};

struct RuntimeStream {
  tb_stream handle;
  int priority;  // what the runtime was asked for
};

struct DeviceStreams {
  std::mutex mutex;
  std::deque<RuntimeStream> by_id;    // index = c10 stream id; a deque keeps growth cheap
  std::map<int, PriorityPool> pools;  // by priority; priority 0's holds ids 1..kStreamPoolSize
};

std::vector<std::unique_ptr<DeviceStreams>> devices;

DeviceStreams& streams_of(c10::DeviceIndex device) {
  TORCH_CHECK_INDEX(device >= 0 && static_cast<size_t>(device) < devices.size(), "device index ", int(device),
                    " is out of range for '", runtime().name(), "' (", devices.size(), " devices)");
  return *devices[device];
}

tb_stream create(c10::DeviceIndex device, int priority) {
  tb_stream handle = nullptr;
  TB_CALL(stream_create, device, priority, &handle);
  return handle;
}

// Current stream id per device for this thread (0, the default stream, until changed).
std::vector<c10::StreamId>& thread_current() {
  thread_local std::vector<c10::StreamId> current;
  if (current.size() < devices.size()) current.resize(devices.size(), 0);
  return current;
}

// The pool of `priority` on a device, its streams created on first use. Caller holds the lock.
PriorityPool& pool_of(DeviceStreams& streams, c10::DeviceIndex device, int requested) {
  const int priority = std::clamp(requested, kHighestStreamPriority, 0);
  PriorityPool& pool = streams.pools[priority];
  while (pool.ids.size() < static_cast<size_t>(kStreamPoolSize)) {
    streams.by_id.push_back({create(device, priority), priority});
    pool.ids.push_back(static_cast<c10::StreamId>(streams.by_id.size() - 1));
  }
  return pool;
}

// The stream `stream` names, or nullptr when its device never handed out that id. Caller holds
// the lock.
const RuntimeStream* find(const DeviceStreams& streams, const c10::Stream& stream) {
  const c10::StreamId id = stream.id();
  return id >= 0 && static_cast<size_t>(id) < streams.by_id.size() ? &streams.by_id[id] : nullptr;
}

}  // namespace

void init_streams(int device_count) {
  for (int d = 0; d < device_count; ++d) {
    auto streams = std::make_unique<DeviceStreams>();
    streams->by_id.push_back({create(d, 0), 0});  // id 0: the default stream
    pool_of(*streams, static_cast<c10::DeviceIndex>(d), 0);
    devices.push_back(std::move(streams));
  }
}

tb_stream native_stream(const c10::Stream& stream) {
  DeviceStreams& streams = streams_of(stream.device_index());
  std::lock_guard<std::mutex> lock(streams.mutex);
  const RuntimeStream* found = find(streams, stream);
  TORCH_CHECK(found != nullptr, "unknown stream id ", stream.id(), " on ", stream.device());
  return found->handle;
}

int stream_priority(const c10::Stream& stream) {
  TORCH_CHECK_VALUE(stream.device_type() == c10::DeviceType::PrivateUse1, "stream_priority: ", stream,
                    " is not a stream of the SDK device");
  DeviceStreams& streams = streams_of(stream.device_index());
  std::lock_guard<std::mutex> lock(streams.mutex);
  const RuntimeStream* found = find(streams, stream);
  TORCH_CHECK_VALUE(found != nullptr, "unknown stream id ", stream.id(), " on ", stream.device());
  return found->priority;
}

c10::Stream default_stream(c10::DeviceIndex device) {
  streams_of(device);
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), 0);
}

c10::Stream current_stream(c10::DeviceIndex device) {
  streams_of(device);
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device),
                     thread_current()[device]);
}

c10::Stream pool_stream(c10::DeviceIndex device, int priority) {
  DeviceStreams& streams = streams_of(device);
  std::lock_guard<std::mutex> lock(streams.mutex);
  PriorityPool& pool = pool_of(streams, device, priority);
  const c10::StreamId id = pool.ids[pool.next++ % pool.ids.size()];
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), id);
}

c10::Stream exchange_current_stream(const c10::Stream& stream) {
  native_stream(stream);  // validates the id
  const c10::Stream previous = current_stream(stream.device_index());
  thread_current()[stream.device_index()] = stream.id();
  return previous;
}

}  // namespace torchbridge::sdk
