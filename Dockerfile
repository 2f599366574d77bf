# One image for every gpu-health service: `python -m services.<name>` or `python -m shared.<tool>`.
FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

# Dependencies first, in their own layer: code changes do not reinstall them.
COPY pyproject.toml ./
RUN python - <<'PY' > /tmp/requirements.txt && pip install -r /tmp/requirements.txt
import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))
PY

COPY shared ./shared
COPY services ./services
COPY schema ./schema
RUN useradd --system --uid 10001 --home-dir /app gpuhealth
USER gpuhealth
ENV PYTHONPATH=/app
CMD ["python", "-m", "shared.migrate"]
