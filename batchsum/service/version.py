"""batchsum's version, stated once at the bottom of the house, so that every layer can name it
(the run's start event, its report) without importing the top package."""

__version__ = "0.1.0"
