"""kiso's version, the single source: ``kiso.__version__`` re-exports it and the build reads it
(``[tool.hatch.version]`` in pyproject.toml). Its own module, so the kernel can read the version
without importing the package face (:mod:`kiso`)."""

__version__ = "0.1.0"
