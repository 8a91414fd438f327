"""Child processes that multiprocessing starts as fresh interpreters (torch.multiprocessing.spawn,
a DataLoader's workers under the spawn or forkserver method, any Process(...).start()) would run
without redirection: the usual DDP program (mp.spawn, init_process_group("nccl"), .cuda(rank))
then failed in every child. The target of each process started is wrapped, so the child enables
redirection towards the parent's target before running it. A forked child inherits the parent's
redirection, and the wrapper then does nothing."""

import multiprocessing.process
import multiprocessing.reduction


class RedirectedTarget:
    """A picklable callable: enables redirection (as the parent had it), then calls `function`
    with the process's arguments. They travel inside it, pickled apart: a spawned child unpickled
    them before the target ran, and an argument naming the target's device (torch.device("cuda")
    made under redirection to emu, a tensor on it) failed there, before any device was loaded."""

    def __init__(self, function, target, explicit, args=(), kwargs=None):
        self.function, self.target, self.explicit = function, target, explicit
        self._arguments = (tuple(args), dict(kwargs or {}))
        self._pickled_arguments = None  # set in a spawned child until the target runs

    def __reduce__(self):
        # With the parent's reducers, as multiprocessing pickles arguments (tensors in shared memory).
        arguments = bytes(multiprocessing.reduction.ForkingPickler.dumps(self._arguments))
        return _rebuild, (self.function, self.target, self.explicit, arguments)

    def __call__(self):
        from torchbridge import redirect

        if not redirect.is_enabled():
            # A detected target is detected again (same machine, same environment), so that it
            # keeps taking only the requests for accelerators this machine lacks.
            redirect.enable(self.target if self.explicit else None)
        if self._pickled_arguments is not None:
            self._arguments = multiprocessing.reduction.ForkingPickler.loads(self._pickled_arguments)
            self._pickled_arguments = None
        args, kwargs = self._arguments
        return self.function(*args, **kwargs)


def _rebuild(function, target, explicit, pickled_arguments):
    rebuilt = RedirectedTarget(function, target, explicit)
    rebuilt._pickled_arguments = pickled_arguments
    return rebuilt


def install(patcher, redirector):
    original_start = multiprocessing.process.BaseProcess.start

    def start(self):
        if self._target is not None and not isinstance(self._target, RedirectedTarget):
            self._target = RedirectedTarget(self._target, redirector.target, redirector.explicit, self._args,
                                            self._kwargs)
            self._args, self._kwargs = (), {}
        return original_start(self)

    patcher.replace(multiprocessing.process.BaseProcess, "start", start)
