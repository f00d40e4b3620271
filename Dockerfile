# One image for bin/migrate, bin/api and bin/worker; docker-compose.yml builds it once
# (docker compose build) and runs each command from it. Dependencies are installed here,
# at build time, never when a container starts.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# Dependencies first, from setup.cfg alone: this layer is rebuilt only when they change.
# With the `otel` extra, so OTEL_TRACES_EXPORTER can turn tracing on (off by default).
COPY setup.cfg pyproject.toml README.md ./
RUN mkdir flowforge && touch flowforge/__init__.py \
    && pip install '.[otel]' && pip uninstall -y flowforge && rm -rf flowforge build *.egg-info
COPY flowforge ./flowforge
COPY bin ./bin
COPY sql ./sql
# Editable, so the `flowforge` command and bin/* use the same /app/flowforge and /app/sql.
RUN pip install --no-deps -e . \
    && useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin flowforge
USER flowforge

EXPOSE 8000
# Exec form: the process itself receives SIGTERM (compose adds tini with `init: true`).
CMD ["bin/api", "--bind", "0.0.0.0:8000"]
