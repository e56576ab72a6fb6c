"""make soak: an hour at a steady share of capacity, every model through both paths (__main__.py says how)."""
