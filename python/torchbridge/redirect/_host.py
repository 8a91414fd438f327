"""Streams and events for a CPU target. CPU operators run to completion before returning, so a
stream has nothing to order and an event is reached when it is recorded: its timestamp is the
device's own time, taken in program order."""

import itertools
import threading
import time

import torch


class HostStream:
    """A stream of the CPU target, with torch.cuda.Stream's attributes. Each stream has its own
    id (the default stream 0), as CUDA's do, and one of them is current per thread."""

    _ids = itertools.count(1)
    device_type = 0  # c10::DeviceType::CPU, the number torch.Stream.device_type gives
    device_index = 0
    # The CPU runs work in program order: it has one priority level. CUDA clamps a requested
    # priority into its range too (torch.cuda.Stream(priority=-9) gets the highest it has).
    priority = 0

    def __init__(self, stream_id=None):
        self.stream_id = next(HostStream._ids) if stream_id is None else stream_id

    @property
    def device(self):
        return torch.device("cpu")

    @staticmethod
    def priority_range():
        return (0, 0)

    @property
    def cuda_stream(self):
        raise AttributeError("cuda_stream: a stream of the CPU target has no CUDA stream handle; code that hands "
                             "it to CUDA kernels or libraries needs a CUDA device")

    def __eq__(self, other):
        return isinstance(other, HostStream) and other.stream_id == self.stream_id

    def __hash__(self):
        return hash(("cpu", self.stream_id))

    def __repr__(self):
        return f"<HostStream of the CPU target, id {self.stream_id}>"

    def wait_stream(self, stream):
        pass  # earlier CPU work has already finished

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        event = event or HostEvent()
        event.record(self)
        return event

    def synchronize(self):
        pass

    def query(self):
        return True

    def __enter__(self):
        _streams_entered_from().append(current_host_stream())
        set_current_host_stream(self)
        return self

    def __exit__(self, *exc_info):
        # A stack, not an attribute of the stream: the same stream may be entered again inside
        # itself, or from another thread.
        set_current_host_stream(_streams_entered_from().pop())
        return False


DEFAULT_HOST_STREAM = HostStream(stream_id=0)
_current = threading.local()  # as CUDA's current stream, per thread


def current_host_stream():
    return getattr(_current, "stream", DEFAULT_HOST_STREAM)


def set_current_host_stream(stream):
    _current.stream = stream


def _streams_entered_from():
    if not hasattr(_current, "entered_from"):
        _current.entered_from = []
    return _current.entered_from


class HostEvent:
    def __init__(self, enable_timing=False, blocking=False, interprocess=False, **_):
        self.enable_timing = enable_timing
        self._time_ns = None

    def record(self, stream=None):
        self._time_ns = time.perf_counter_ns()

    def wait(self, stream=None):
        pass

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, end_event):
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("both events need enable_timing=True to measure elapsed time")
        if self._time_ns is None or end_event._time_ns is None:
            raise RuntimeError("both events must be recorded before measuring elapsed time")
        return (end_event._time_ns - self._time_ns) / 1e6
