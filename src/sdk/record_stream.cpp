// Tensor.record_stream for SDK devices: torch implements it for CUDA only (the CPU has no streams
// to record), so the CPU fallback cannot run it. The caching allocator already tracks stream uses
// (a block freed while recorded streams may still use it is reused only after their work), so
// recording is one call.
#include "sdk/registration.h"

#include "sdk/caching_allocator.h"

#include <torch/library.h>

#include <optional>
#include <string>

namespace torchbridge::sdk {
namespace {

// A stream of another device of this type is taken, as CUDA's record_stream takes one: a copy to
// another device runs on the destination's stream, and the allocator fences each recorded
// stream on its own device before the memory is reused.
void record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == self.device().type(), "record_stream: the tensor is on ", self.device(),
              " but the stream on ", stream.device(), "; record a stream of a ", self.device().type(), " device");
  caching_allocator().recordStream(self.storage().data_ptr(), stream);
}

}  // namespace

void register_record_stream() {
  static auto* library =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  library->impl("record_stream", TORCH_FN(record_stream));
}

}  // namespace torchbridge::sdk
