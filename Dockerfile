# syntax=docker/dockerfile:1
# The controller image: `autoscaler run` as a non-root user, from the wheel this repository builds.
#   docker build -t ghcr.io/gpu-autoscaler/gpu-autoscaler:0.1.0 .
# Stage 1 builds the project's wheel and the wheels of its runtime dependencies; stage 2 installs exactly those
# (offline, --no-index) into a venv. No compiler is needed in either: every dependency ships manylinux wheels.
# The base is pinned by tag; to pin by digest, replace both FROM lines with python:3.11-slim-bookworm@sha256:<digest>
# of the image you have verified. tests/kube/test_dockerfile.py lints this file with hadolint and checks its shape.

FROM python:3.11-slim-bookworm AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
# Only what the wheel is built from (.dockerignore keeps everything else out of the context).
COPY pyproject.toml README.md ./
COPY autoscaler ./autoscaler
COPY forecast ./forecast
RUN pip wheel --no-cache-dir --wheel-dir /wheels . \
    && ls /wheels/gpu_autoscaler-*.whl

FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="gpu-autoscaler" \
      org.opencontainers.image.description="Metrics-driven GPU autoscaler and rebalancer for Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/gpu-autoscaler \
    PATH=/opt/gpu-autoscaler/bin:$PATH \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib
# The wheels come in through a bind mount of the builder stage, so they are not a layer of this image.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m venv "$VIRTUAL_ENV" \
    && "$VIRTUAL_ENV/bin/pip" install --no-cache-dir --no-index --find-links=/wheels /wheels/gpu_autoscaler-*.whl \
    && "$VIRTUAL_ENV/bin/pip" uninstall --yes pip \
    && groupadd --gid 65532 autoscaler \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin autoscaler \
    && autoscaler --help >/dev/null
# The same numeric UID/GID as deploy/base/deployment.yaml's securityContext (runAsNonRoot needs a number).
USER 65532:65532
WORKDIR /tmp
EXPOSE 8080
ENTRYPOINT ["autoscaler"]
CMD ["run"]
