"""torch.nn.DataParallel on devices other than CUDA. DataParallel's own code is device-generic
since torch 2.11 (torch.accelerator streams and device scopes in parallel_apply), except for the
collectives of torch.nn.parallel.comm, which call CUDA kernels (torch._C._broadcast_coalesced,
_scatter, _gather) that other builds of torch do not have, and its balance check, which divides
by the devices' multiprocessor counts. Here the collectives are copies between devices; the
autograd functions that wrap them (torch.nn.parallel._functions: Broadcast, ReduceAddCoalesced,
Scatter, Gather) and so DataParallel's gradients are torch's own.

Used by redirection (the target's devices stand for CUDA's) and for an SDK device loaded where
CUDA is unavailable (its devices are DataParallel's). comm names devices the way CUDA's kernels
do: an int is a device index, -1 the CPU, None the current device."""

import contextlib
import importlib

import torch
import torch.nn.parallel.comm

CPU = torch._C.device("cpu")
# torch.nn.parallel.data_parallel is also the name of a function in torch.nn.parallel.
DATA_PARALLEL_MODULE = importlib.import_module("torch.nn.parallel.data_parallel")


def collectives(device_type, current_index, resolve):
    """{name: function} replacing torch.nn.parallel.comm's collectives over `device_type`'s devices
    (the CPU's: all of them the CPU). current_index() is the current device's index; `resolve`
    turns a string or torch.device into the torch.device to use."""

    def device_of(spec):
        if device_type == "cpu" and (spec is None or isinstance(spec, int)):
            return CPU
        if spec is None:
            return torch._C.device(device_type, current_index())
        if isinstance(spec, int):
            return CPU if spec < 0 else torch._C.device(device_type, spec)
        return resolve(spec)

    def copies_onto(tensor, devices):
        # As CUDA's broadcast: the source device's entry is the tensor itself, so DataParallel's
        # first replica shares the module's buffers and keeps their in-place updates (BatchNorm's
        # running statistics), as torch documents. Only the first such entry: with the CPU as the
        # target every "device" is the CPU, and the other replicas must stay copies.
        source_taken = False
        result = []
        for d in devices:
            target = device_of(d)
            if target == tensor.device and not source_taken:
                result.append(tensor)
                source_taken = True
            else:
                result.append(tensor.to(target, copy=True))
        return result

    def broadcast(tensor, devices=None, *, out=None):
        if (devices is None) == (out is None):
            raise RuntimeError("broadcast: give exactly one of 'devices' and 'out' "
                               f"(got devices={devices!r}, out={'None' if out is None else 'tensors'})")
        if out is not None:
            for destination in out:
                destination.copy_(tensor)
            return tuple(out)
        return tuple(copies_onto(tensor, devices))

    def broadcast_coalesced(tensors, devices, buffer_size=10485760):
        # One list per device, each holding every tensor.
        per_tensor = [copies_onto(t, devices) for t in tensors]
        return [[copies[i] for copies in per_tensor] for i in range(len(devices))]

    def reduce_add(inputs, destination=None):
        target = device_of(destination)
        total = inputs[0].to(target, copy=True)
        for addend in inputs[1:]:
            if addend.shape != total.shape:
                raise ValueError(f"reduce_add: tensor shapes differ: {tuple(total.shape)} and {tuple(addend.shape)}")
            total.add_(addend.to(target))
        return total

    def reduce_add_coalesced(inputs, destination=None, buffer_size=10485760):
        # inputs: one sequence of tensors per device; the i-th tensors of all devices are summed.
        return tuple(reduce_add(list(same_tensor), destination) for same_tensor in zip(*inputs))

    def scatter(tensor, devices=None, chunk_sizes=None, dim=0, streams=None, *, out=None):
        if out is not None:
            if devices is not None or chunk_sizes is not None:
                raise RuntimeError("scatter: 'out' excludes 'devices' and 'chunk_sizes' (their sizes are the outputs')")
            for destination, chunk in zip(out, tensor.split([o.size(dim) for o in out], dim)):
                destination.copy_(chunk)
            return tuple(out)
        if devices is None:
            raise RuntimeError("scatter: give 'devices' or 'out'")
        chunks = tensor.split(list(chunk_sizes), dim) if chunk_sizes else tensor.chunk(len(devices), dim)
        results = []
        for i, (chunk, d) in enumerate(zip(chunks, devices)):
            # Scatter.forward waits for these streams before the chunks are used.
            with streams[i] if streams and streams[i] is not None else contextlib.nullcontext():
                results.append(chunk.contiguous().to(device_of(d), non_blocking=True))
        return tuple(results)

    def gather(tensors, dim=0, destination=None, *, out=None):
        if out is not None:
            if destination is not None:
                raise RuntimeError("gather: 'out' excludes 'destination' (the output is on out's device)")
            return torch.cat([t.to(out.device) for t in tensors], dim, out=out)
        target = CPU if destination == "cpu" else device_of(destination)
        return torch.cat([t.to(target) for t in tensors], dim)

    return {"broadcast": broadcast, "broadcast_coalesced": broadcast_coalesced, "reduce_add": reduce_add,
            "reduce_add_coalesced": reduce_add_coalesced, "scatter": scatter, "gather": gather}


def balance_check(properties_of):
    """DataParallel's _check_balance, which warns when devices differ in memory or multiprocessors
    by more than 25%, skipped where a device reports no multiprocessor count (torch divides by it)."""
    original = DATA_PARALLEL_MODULE._check_balance

    def check_balance(device_ids):
        properties = [properties_of(i) for i in device_ids]
        if all(p.total_memory > 0 and p.multi_processor_count > 0 for p in properties):
            original(device_ids)

    return check_balance


def install_for_sdk_device(name, device_module):
    """nn.DataParallel over the SDK device's devices, where it is DataParallel's device type: loaded
    on a machine where CUDA is unavailable (DataParallel prefers CUDA, whose collectives torch has)."""
    if torch.cuda.is_available():
        return

    for function_name, replacement in collectives(name, device_module.current_device, torch._C.device).items():
        setattr(torch.nn.parallel.comm, function_name, replacement)
    DATA_PARALLEL_MODULE._check_balance = balance_check(device_module.get_device_properties)
