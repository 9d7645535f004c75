"""The package version, in one place (pyproject.toml says the same)."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0.dev0"
