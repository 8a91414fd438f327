"""torch.cuda's stream and event API on the torch.<name> module of an SDK device: Stream, Event,
stream()/StreamContext, current_stream, default_stream, set_stream. They are torch's own generic
torch.Stream and torch.Event (which reach the device through its C++ guard), bound to the device,
so code written against torch.cuda's names, and torch's own users of a device module's streams
(FSDP's device handle calls Stream, Event and stream), run on it unchanged."""

import torch


def add_streams(module, name: str, index) -> None:
    """Adds the stream API to `module`; index(device) turns None/int/str/torch.device into an index."""

    def require_stream(stream, call: str) -> None:
        if stream is not None and not isinstance(stream, torch.Stream):
            raise TypeError(f"torch.{name}.{call}: expected a torch.Stream or None, got {type(stream).__name__}")

    class Stream(torch.Stream):
        """A new stream on the device (the current device for None), as torch.cuda.Stream."""

        def __new__(cls, device=None, priority=0, **torch_stream_arguments):
            if torch_stream_arguments:  # torch's own (stream_id, device_index, device_type) form
                return super().__new__(cls, priority=priority, **torch_stream_arguments)
            chosen, count = index(device), module.device_count()
            if not 0 <= chosen < count:  # as every other call says it (the runtime's set_device failed)
                raise IndexError(f"device index {chosen} is out of range for '{name}' ({count} devices)")
            return super().__new__(cls, device=torch.device(name, chosen), priority=priority)

    class EventType(type):
        def __instancecheck__(cls, instance):
            return isinstance(instance, torch.Event) and getattr(instance.device, "type", None) == name

    class Event(metaclass=EventType):
        """An event of the device, as torch.cuda.Event (bound to a device when first recorded). It
        makes a torch.Event itself, not a subclass: torch checks the exact type where an event is
        an argument (Event.elapsed_time, Stream.record_event: "expected other to be a torch.Event
        object"). isinstance(e, torch.<name>.Event) holds for every event of the device."""

        def __new__(cls, enable_timing=False, blocking=False, interprocess=False):
            return torch.Event(device=name, enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)

    class StreamContext:
        """Makes `stream` current for the `with` block (None: changes nothing), as torch.cuda's: the
        stream's device becomes current too, and both the device and that device's previous stream
        come back at the end (torch.Stream's own context does exactly this)."""

        def __init__(self, stream):
            require_stream(stream, "stream")
            if stream is not None and stream.device.type != name:
                raise ValueError(f"torch.{name}.stream: expected a stream of {name!r} or None, got one of "
                                 f"{stream.device}")
            self.stream = stream

        def __enter__(self):
            if self.stream is not None:
                self.stream.__enter__()
            return self.stream

        def __exit__(self, *exception):
            if self.stream is not None:
                self.stream.__exit__(*exception)
            return False

    def stream(stream) -> StreamContext:
        return StreamContext(stream)

    def current_stream(device=None) -> torch.Stream:
        return torch.accelerator.current_stream(index(device))

    def default_stream(device=None) -> torch.Stream:
        current = current_stream(device)  # for the device type's number
        return torch.Stream(stream_id=0, device_index=current.device_index, device_type=current.device_type)

    def set_stream(stream) -> None:
        require_stream(stream, "set_stream")
        if stream is not None:
            torch.accelerator.set_stream(stream)

    for name_, value in (("Stream", Stream), ("Event", Event), ("StreamContext", StreamContext), ("stream", stream),
                         ("current_stream", current_stream), ("default_stream", default_stream),
                         ("set_stream", set_stream)):
        setattr(module, name_, value)
