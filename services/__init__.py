"""The gpu-health services; each is `python -m services.<name>` and imports only `shared`."""
