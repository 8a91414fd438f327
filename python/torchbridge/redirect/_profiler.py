"""torch.profiler and torch.autograd.profiler under redirection. A program written for CUDA asks
for the CUDA activity (ProfilerActivity.CUDA, use_cuda=True, use_device="cuda"); on a target that
is not CUDA, torch then records a CUDA event around every operator, fails each time and prints a
warning with a C++ stack trace per operator. The request becomes the target's own activity: an SDK
device's (PrivateUse1, whose device times TorchBridge's profiler stubs measure), XPU's, or none
for the CPU and MPS, which record host activity only."""

import torch
import torch.autograd.profiler
import torch.profiler
from torch.profiler import ProfilerActivity


def _device_activity(target_type):
    """The activity recording the target's device work, or None when it has none."""
    if target_type == torch._C._get_privateuse1_backend_name():
        return ProfilerActivity.PrivateUse1
    return {"xpu": ProfilerActivity.XPU}.get(target_type)


def redirect_activities(activities, device_activity):
    """activities (ProfilerActivity values and {activity: filters} dicts, as torch takes them)
    with CUDA replaced by device_activity, or dropped when that is None."""
    def mapped(activity):
        return device_activity if activity == ProfilerActivity.CUDA else activity

    result, seen = [], set()
    for item in activities:
        if isinstance(item, dict):
            item = {mapped(key): value for key, value in item.items() if mapped(key) is not None}
            keys = set(item) - seen
            if keys:
                result.append({key: item[key] for key in keys})
                seen |= keys
        elif (activity := mapped(item)) is not None and activity not in seen:
            result.append(activity)
            seen.add(activity)
    return result or [ProfilerActivity.CPU]


def install(patcher, target_type):
    device_activity = _device_activity(target_type)
    kineto_profile, legacy_profile = torch.profiler.profile, torch.autograd.profiler.profile

    class profile(kineto_profile):
        __doc__ = kineto_profile.__doc__

        def __init__(self, *args, activities=None, use_cuda=None, **kwargs):
            if use_cuda:  # deprecated spelling of "add the CUDA activity"
                activities = list(activities or torch.profiler.supported_activities()) + [ProfilerActivity.CUDA]
            if activities is not None:
                activities = redirect_activities(activities, device_activity)
            super().__init__(*args, activities=activities, **kwargs)

    class legacy(legacy_profile):
        __doc__ = legacy_profile.__doc__

        def __init__(self, *args, use_cuda=False, use_device=None, **kwargs):
            if use_cuda:
                use_device = "cuda"
            if isinstance(use_device, str) and use_device.split(":")[0] == "cuda":
                use_device = target_type if device_activity is not None else None
            super().__init__(*args, use_device=use_device, **kwargs)

    for owner in (torch.profiler, torch.profiler.profiler):
        patcher.replace(owner, "profile", profile)
    patcher.replace(torch.autograd.profiler, "profile", legacy)
