"""torch.cuda.Stream for an SDK target: a torch.Stream of the target device that also answers the
questions CUDA code asks of its streams (priority, priority_range), from what the SDK asked the
device's runtime for."""

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

    @property
    def cuda_stream(self):
        raise AttributeError(f"cuda_stream: a stream of the target '{self.device.type}' has no CUDA stream handle; "
                             "code that hands it to CUDA kernels or libraries needs a CUDA device")


def as_target_stream(stream):
    """The same stream (device, id) as a TargetStream."""
    return TargetStream(stream_id=stream.stream_id, device_index=stream.device_index,
                        device_type=stream.device_type)
