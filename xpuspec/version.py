"""The xpuspec version (as pyproject.toml says), in a module of its own: what records it (a bundle's
manifest) need not import the package, whose ``Pipeline`` sits above them."""

__version__ = "0.1.0"
