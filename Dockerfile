# numalign: the operator and the node agent in one image (`numalign operator`,
# `numalign agent`). Base pinned by tag (Python 3.11 patch release on Debian 12); pin by
# digest too (python:3.11.13-slim-bookworm@sha256:...) where your registry policy asks.

# --- builder: the numalign wheel and wheels of all its dependencies -----------------
FROM python:3.11.13-slim-bookworm AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist . \
    && pip wheel --no-cache-dir --wheel-dir /wheels /dist/*.whl

# --- runtime: the wheels installed, no build tools, no sources, non-root -------------
FROM python:3.11.13-slim-bookworm
LABEL org.opencontainers.image.title="numalign" \
      org.opencontainers.image.description="NUMA and device-topology alignment for Kubernetes" \
      org.opencontainers.image.source="https://github.com/numalign/numalign" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp
# The wheels are bind-mounted from the builder, so they never become a layer here.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels /wheels/numalign-*.whl \
    && pip uninstall --yes setuptools wheel \
    && numalign --help > /dev/null
USER 65532:65532
EXPOSE 8080 9090 9443
ENTRYPOINT ["numalign"]
CMD ["--help"]
