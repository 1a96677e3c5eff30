"""batchsum's version, stated once at the bottom of the house, so that every layer can name it
(``batchsum --version``, the run's metrics, ``batchsum.__version__``) without importing the top package."""

__version__ = "0.1.0"
