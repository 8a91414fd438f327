"""Configuration objects shared by the package (``torchbridge.core.config``)."""
