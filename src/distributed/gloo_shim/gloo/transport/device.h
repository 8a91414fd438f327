#pragma once
// Stand-in for Gloo's transport/device.h (see ../README.md): both types are only held by pointer.

namespace gloo::transport {
class Device;
class UnboundBuffer;
}  // namespace gloo::transport
