#include "cuda_handles.h"

#include <string>

#include "cuda_status.h"

namespace torchbridge::cuda_device {

HandleRegistry<tb_stream>& live_streams() {
  static auto* registry = new HandleRegistry<tb_stream>();
  return *registry;
}

HandleRegistry<tb_event>& live_events() {
  static auto* registry = new HandleRegistry<tb_event>();
  return *registry;
}

tb_status check_stream(const char* entry, tb_stream stream) {
  if (stream != nullptr && live_streams().contains(stream)) return TB_SUCCESS;
  return report_error(TB_ERROR_INVALID_HANDLE,
                      std::string(entry) + ": " +
                          (stream == nullptr ? "the stream is NULL"
                                             : "unknown or already destroyed stream"));
}

tb_status check_event(const char* entry, tb_event event) {
  if (event != nullptr && live_events().contains(event)) return TB_SUCCESS;
  return report_error(TB_ERROR_INVALID_HANDLE,
                      std::string(entry) + ": " +
                          (event == nullptr ? "the event is NULL"
                                            : "unknown or already destroyed event"));
}

}  // namespace torchbridge::cuda_device
