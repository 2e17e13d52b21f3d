"""sentsim: harvest sentence-pair similarities from contexts on Ray, then distil encoders from them."""

__version__ = "0.1.0"
