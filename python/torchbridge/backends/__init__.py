"""Backends: detection, creation by name, and the per-vendor classes."""

from .base import Backend, BackendFactory, detect_best_backend

__all__ = ["Backend", "BackendFactory", "detect_best_backend"]
