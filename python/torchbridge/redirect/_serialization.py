"""torch.load under redirection. A checkpoint written on a GPU machine records, for each storage,
where it lived ("cuda:0", "cuda:1"); torch restores it there unless map_location says otherwise,
and every form of map_location that names a CUDA device, or leaves a storage where it was saved,
must send it to the target instead. torch accepts five forms (torch.serialization's
_get_restore_location): None, a device string or torch.device, a {saved: wanted} dict, and a
callable whose None result means "where it was saved"."""

import functools

import torch
import torch.serialization


def _is_location(value) -> bool:
    return isinstance(value, (str, bytes, torch._C.device))


def redirect_map_location(map_location, resolve):
    """The map_location that restores where redirection sends each storage's saved location."""
    restore = torch.serialization.default_restore_location

    def restore_redirected(storage, location):
        try:
            device = resolve(location)
        except ValueError as error:  # a device type this process lacks (a file saved on another SDK device)
            raise ValueError(f"torch.load: a storage was saved on {location!r}, a device this process cannot "
                             f"place ({error}); pass map_location, e.g. map_location=\"cpu\" or \"cuda\" (the "
                             "redirection target)") from error
        return restore(storage, str(device))

    if map_location is None:
        return restore_redirected
    if _is_location(map_location):
        return resolve(map_location.decode() if isinstance(map_location, bytes) else map_location)
    if isinstance(map_location, dict):
        # Locations the dict does not name stay where they were saved, as in torch: redirected too.
        mapping = dict(map_location)
        return lambda storage, saved_at: restore_redirected(storage, mapping.get(saved_at, saved_at))
    if callable(map_location):
        @functools.wraps(map_location)
        def call(storage, saved_at):
            restored = map_location(storage, saved_at)
            return restore_redirected(storage, saved_at) if restored is None else restored

        return call
    return map_location  # torch judges anything else


def install(patcher, redirector):
    original_load = torch.load

    @functools.wraps(original_load)
    def load(f, map_location=None, *args, **kwargs):
        return original_load(f, redirect_map_location(map_location, redirector.resolve), *args, **kwargs)

    patcher.replace(torch, "load", load)
