"""The release of tfckpt, in one place (the package, the command line and export metadata)."""

__version__ = "0.1.0"
