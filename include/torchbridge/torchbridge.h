#pragma once
// Umbrella header for the TorchBridge backend layer.

#include <torchbridge/backend.h>
#include <torchbridge/device_info.h>
#include <torchbridge/health.h>
#include <torchbridge/memory_stats.h>
#include <torchbridge/one_accelerator.h>
#include <torchbridge/optimize/config.h>
#include <torchbridge/optimize/manager.h>
#include <torchbridge/precision.h>
#include <torchbridge/precision_policy.h>
#include <torchbridge/privateuse1.h>
#include <torchbridge/redirect.h>
#include <torchbridge/registry.h>
#include <torchbridge/version.h>
