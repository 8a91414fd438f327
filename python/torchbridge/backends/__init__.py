"""Backends: detection, creation by name, the per-vendor classes, and the device description."""

from .base import Backend, BackendFactory, detect_best_backend
from .device_info import DeviceInfo

__all__ = ["Backend", "BackendFactory", "DeviceInfo", "detect_best_backend"]
