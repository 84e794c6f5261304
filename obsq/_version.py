"""The version, in one place that every module can import without importing the package:
pyproject.toml reads it from here (a dynamic version); the chart's appVersion and the image
tag carry the same (a test checks)."""

__version__ = "0.1.0"
