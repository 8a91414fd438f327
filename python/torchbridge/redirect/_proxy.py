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

        # Equal to the real type, as isinstance answers for it: torch.fx's code generator imports
        # `device` for graphs holding a torch.device only where that global equals torch.device,
        # and under redirection every such graph raised NameError: name 'device' is not defined
        # (torch.compile's backward under autocast, torch.export(...).module()).
        def __eq__(cls, other):
            return other is cls or other is real_type

        def __ne__(cls, other):
            return not Meta.__eq__(cls, other)

        def __hash__(cls):
            return hash(real_type)

    namespace = {"__doc__": real_type.__doc__, "__module__": real_type.__module__, **(class_attributes or {})}
    return Meta(name or real_type.__name__, (), namespace)


class StandIn(type):
    """Metaclass of a subclass that takes its base's place in torch's namespace (torch.amp.GradScaler
    and torch.autocast under redirection). isinstance/issubclass with the stand-in answer for the
    base, the real type: a scaler made before enable(), or by a torch class deriving from the real
    one, is still a torch.amp.GradScaler (checkpoint.save_training_state refused those). Classes
    deriving from the stand-in (torch.cuda.amp.GradScaler under redirection) answer as usual: a
    torch.amp.GradScaler is not one of them, as in torch."""

    def __instancecheck__(cls, obj):
        real_type = cls.__bases__[0]
        if isinstance(real_type, StandIn):
            return type.__instancecheck__(cls, obj)
        return isinstance(obj, real_type)

    def __subclasscheck__(cls, sub):
        real_type = cls.__bases__[0]
        if isinstance(real_type, StandIn):
            return type.__subclasscheck__(cls, sub)
        return issubclass(sub, real_type)
