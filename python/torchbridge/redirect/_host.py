"""Streams and events for a CPU target. CPU operators run to completion before returning, so a
stream has nothing to order and an event is reached when it is recorded: its timestamp is the
device's own time, taken in program order."""

import time


class HostStream:
    def __init__(self, device=None, priority=0, **_):
        self.device = device

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
        return self

    def __exit__(self, *exc_info):
        return False


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
