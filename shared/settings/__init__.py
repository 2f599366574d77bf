"""A service's typed settings: their models, the environment and TOML they are read from, their
names and their generated reference.

Not to be confused with config/, the reviewed policy files that settings point at.
"""
