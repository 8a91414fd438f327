"""torch.cuda.Stream for an SDK target: a torch.Stream of the target device that also answers as
CUDA code asks it: priority and priority_range from what the SDK asked the device's runtime for,
and torch.cuda's keyword arguments, which the C methods of torch.Stream take by position only
(Stream.wait_event(event=e) raised "takes no keyword arguments"). Events stay plain torch.Events:
torch's Event.elapsed_time takes no subclass as its end event."""

import torch

from .. import _C

# CUDA's convention, which the SDK follows: lower numbers run first; torch clamps CUDA's
# priorities to four levels, and the SDK's stream pools to the same 0..-3.
_PRIORITY_RANGE = (0, -3)


class TargetStream(torch.Stream):
    """A stream of an SDK target, as torch.cuda.Stream hands it out under redirection."""

    @property
    def priority(self):
        return _C.sdk_stream_priority(self.device_index, self.stream_id, self.device_type)

    @staticmethod
    def priority_range():
        return _PRIORITY_RANGE

    def wait_event(self, event):
        return super().wait_event(event)

    def wait_stream(self, stream):
        return super().wait_stream(stream)

    def record_event(self, event=None):  # torch.cuda's: a new event when none is given
        return super().record_event(torch.Event(self.device) if event is None else event)

    @property
    def cuda_stream(self):
        raise AttributeError(f"cuda_stream: a stream of the target '{self.device.type}' has no CUDA stream handle; "
                             "code that hands it to CUDA kernels or libraries needs a CUDA device")


def as_target_stream(stream):
    """The same stream (device, id) as a TargetStream."""
    return TargetStream(stream_id=stream.stream_id, device_index=stream.device_index,
                        device_type=stream.device_type)
