"""TorchBridge: one backend API over every accelerator PyTorch can drive.

The logic lives in the C++ core (libtorchbridge); this package is a thin skin over it.
Importing torchbridge never registers a device: SDK devices such as ``emu`` are loaded explicitly
(``torchbridge.devices.load("emu")``, ``BackendFactory.create("emu")``) or through the
``TORCHBRIDGE_LOAD_DEVICE`` environment variable, because PyTorch has a single PrivateUse1 slot.
"""

import torch  # noqa: F401  (loads libtorch before the extension that links it)

from . import _C

__version__ = _C.__version__

from . import devices  # noqa: E402
from . import memory  # noqa: E402
from .backends import Backend, BackendFactory, detect_best_backend  # noqa: E402
from .config import TorchBridgeConfig  # noqa: E402
from .optimize import UnifiedManager  # noqa: E402
from .validation import UnifiedValidator  # noqa: E402

devices._load_from_environment()

__all__ = ["Backend", "BackendFactory", "TorchBridgeConfig", "UnifiedManager", "UnifiedValidator",
           "detect_best_backend", "devices", "__version__"]
