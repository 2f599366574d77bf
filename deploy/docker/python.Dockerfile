# gpu-health-local/python:3.11 - stands in for `python:3.11-slim` where no registry
# is reachable: Debian bookworm's Python 3.11 in a virtual environment that is
# first on PATH, so `python` and `pip` behave as in the official image (no
# PEP 668 refusal, packages under the venv, not the system's).
FROM gpu-health-local/debian:bookworm
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 python3-venv >/dev/null \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /usr/local/python
ENV PATH=/usr/local/python/bin:$PATH
CMD ["python"]
