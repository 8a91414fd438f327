"""Optimizers built with capturable=True under redirection to the CPU. capturable keeps the step
count on the parameters' device so that a CUDA graph can capture the update; torch allows it on
accelerators only and raises at the first step on the CPU ("params and state_steps must be on
supported devices"). Its update is plain tensor arithmetic, which the CPU computes as any device
does (Adam, AdamW, NAdam, RAdam, Adamax, ASGD, RMSprop, Rprop, Adadelta: within 5e-7 of
capturable=False after 5 steps), so with the CPU as the target the program's own algorithm runs."""

import sys

import torch.optim


def install(patcher):
    # Each optimizer module imported the helper by name: it is replaced in every one of them.
    owners = [module for name, module in list(sys.modules.items())
              if (name == "torch.optim" or name.startswith("torch.optim.")) and module is not None
              and hasattr(module, "_get_capturable_supported_devices")]
    for owner in owners:
        original = owner._get_capturable_supported_devices

        def with_cpu(supports_xla=True, original=original):
            return original(supports_xla) + ["cpu"]

        patcher.replace(owner, "_get_capturable_supported_devices", with_cpu)
