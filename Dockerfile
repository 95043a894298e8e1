# numalign: the operator and the node agent in one image (`numalign operator`,
# `numalign agent`), and kube-scheduler for the second scheduler. Base pinned by tag (Python 3.11 patch release on Debian 12); pin by
# digest too (python:3.11.13-slim-bookworm@sha256:...) where your registry policy asks.
# Without a registry, `numalign dev image` builds the same layout from Debian's packages
# (tests/unit/test_dockerfile.py compares the two).

# --- builder: the numalign wheel and wheels of its dependencies, as pinned -----------
FROM python:3.11.13-slim-bookworm AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md requirements.lock ./
COPY operator/ operator/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist . \
    && pip wheel --no-cache-dir --constraint requirements.lock --wheel-dir /wheels /dist/*.whl

# --- kube-scheduler of the cluster's Kubernetes version, for the second scheduler
# (config/scheduler, the chart's scheduler.enabled); `numalign dev image` carries the
# same version's binary at the same path
FROM registry.k8s.io/kube-scheduler:v1.37.2 AS kube-scheduler

# --- runtime: the wheels in a virtual environment, no build tools, no sources --------
FROM python:3.11.13-slim-bookworm
LABEL org.opencontainers.image.title="numalign" \
      org.opencontainers.image.description="NUMA and device-topology alignment for Kubernetes" \
      org.opencontainers.image.source="https://github.com/numalign/numalign" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/numalign/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# The wheels are bind-mounted from the builder, so they never become a layer here. The
# user has a passwd entry: Kopf names a peer after it where no POD_ID is set.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m venv --without-pip /opt/numalign \
    && pip --disable-pip-version-check --python /opt/numalign/bin/python install \
       --no-cache-dir --no-index --find-links=/wheels /wheels/numalign-*.whl \
    && echo "nonroot:x:65532:65532:nonroot:/tmp:/usr/sbin/nologin" >> /etc/passwd \
    && echo "nonroot:x:65532:" >> /etc/group \
    && numalign --help > /dev/null
COPY --from=kube-scheduler /usr/local/bin/kube-scheduler /usr/local/bin/kube-scheduler
USER 65532:65532
WORKDIR /
EXPOSE 8080/tcp 8081/tcp 9090/tcp 9443/tcp
ENTRYPOINT ["numalign"]
CMD ["--help"]
