"""Portable checkpoints through the C++ core: safetensors files and sharded Hugging Face
directories, read lazily and strictly validated, written atomically; and a training run's whole
state in one such file (``save_training_state`` / ``load_training_state``, with the older forms
``save_state`` / ``load_state``, in _training_state.py)."""

from ._safetensors_io import load, metadata, names, save  # noqa: F401
from ._training_state import (TrainingProgress, load_state, load_training_state, save_state,  # noqa: F401
                              save_training_state)
