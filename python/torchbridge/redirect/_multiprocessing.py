"""Child processes that multiprocessing starts as fresh interpreters (torch.multiprocessing.spawn,
a DataLoader's workers under the spawn or forkserver method, any Process(...).start()) would run
without redirection: the usual DDP program (mp.spawn, init_process_group("nccl"), .cuda(rank))
then failed in every child. The target of each process started is wrapped, so the child enables
redirection towards the parent's target before running it. A forked child inherits the parent's
redirection, and the wrapper then does nothing."""

import multiprocessing.process


class RedirectedTarget:
    """A picklable callable: enables redirection (as the parent had it), then calls `function`."""

    def __init__(self, function, target, explicit):
        self.function, self.target, self.explicit = function, target, explicit

    def __call__(self, *args, **kwargs):
        from torchbridge import redirect

        if not redirect.is_enabled():
            # A detected target is detected again (same machine, same environment), so that it
            # keeps taking only the requests for accelerators this machine lacks.
            redirect.enable(self.target if self.explicit else None)
        return self.function(*args, **kwargs)


def install(patcher, redirector):
    original_start = multiprocessing.process.BaseProcess.start

    def start(self):
        if self._target is not None and not isinstance(self._target, RedirectedTarget):
            self._target = RedirectedTarget(self._target, redirector.target, redirector.explicit)
        return original_start(self)

    patcher.replace(multiprocessing.process.BaseProcess, "start", start)
