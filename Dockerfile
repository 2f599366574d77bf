# One image for every gpu-health service: `python -m services.<name>` or `python -m shared.plumbing.<tool>` (migrate, topic_admin).
# PYTHON_IMAGE is the official image anywhere a registry answers; `make compose-test`
# passes its local stand-in (deploy/docker/python.Dockerfile) instead.
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

# Dependencies first, in their own layer: code changes do not reinstall them. Both distributions'
# (the pipeline's and the library's, gpuhealth/), less the library itself: its code is copied below.
COPY pyproject.toml ./
COPY gpuhealth/pyproject.toml ./gpuhealth/
COPY scripts/requirements.py ./scripts/
RUN python scripts/requirements.py > /tmp/requirements.txt && pip install -r /tmp/requirements.txt

# Everything a service reads at run time: code (gpuhealth/: the library's pieces the services build
# on), migrations, and config/ (the scorer's health rules; without it the scorer exits 2 at start).
COPY gpuhealth ./gpuhealth
COPY shared ./shared
COPY services ./services
COPY schema ./schema
COPY config ./config
RUN useradd --system --uid 10001 --home-dir /app gpuhealth
USER gpuhealth
ENV PYTHONPATH=/app
CMD ["python", "-m", "shared.plumbing.migrate"]
