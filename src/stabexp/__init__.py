"""stabexp: reproduce and extend the studies of why deep Transformers train unstably."""

__version__ = "0.1.0"
