"""Stand-ins for torch types (torch.device, torch.Generator, torch.cuda.Stream, ...) that build
the real objects their redirected way while isinstance/issubclass keep answering for the real
type, so user code that checks types keeps working."""


def proxy_class(real_type, make, name=None, class_attributes=None):
    """A class whose call is `make(*args, **kwargs)` and whose instances are `real_type`'s, with
    `class_attributes` (static methods such as torch.cuda.Stream.priority_range) on the class."""

    class Meta(type):
        def __instancecheck__(cls, obj):
            return isinstance(obj, real_type)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, real_type)

        def __call__(cls, *args, **kwargs):
            return make(*args, **kwargs)

    namespace = {"__doc__": real_type.__doc__, "__module__": real_type.__module__, **(class_attributes or {})}
    return Meta(name or real_type.__name__, (), namespace)
