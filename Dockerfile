# syntax=docker/dockerfile:1
# lad-serve: one Dockerfile, two torch builds (deploy/README.md "Deploy").
#   docker build -t lad-serve:cuda .                                # default: CUDA torch, for GPU nodes
#   docker build -t lad-serve:cpu --build-arg TORCH_VARIANT=cpu .   # CPU-only torch wheel, much smaller
# The CUDA build is PyPI's torch wheel, which brings its own CUDA runtime libraries; the
# host needs only the NVIDIA driver and the container toolkit (`--gpus all`, or a GPU
# resource in Kubernetes). Run as: docker run -p 8000:8000 -e LAD_ADMIN_TOKEN=... IMAGE
# The base image pinned by digest: the multi-platform index of the exact patch tag, as the
# Docker Official Images record it (docker-library/repo-info, repos/python/remote/
# 3.11-slim-bookworm.md: Python 3.11.16, built 2026-08-25). To move to a newer one:
#   docker buildx imagetools inspect python:3.11-slim-bookworm --format '{{json .Manifest.Digest}}'
# and set both the tag's patch version (its PYTHON_VERSION) and the digest here.
ARG PYTHON_IMAGE=python:3.11.16-slim-bookworm@sha256:0bee7276f83efd4a1ee05bbbf4281d95ed28e079220a9457f25a93e3f1e3c31b

# --- stage 1: the lad-serve wheel (sources never reach the runtime image) ---------------
# The service only: app/, calibration_store/ and lad_client; the lab (lad_lab/: eval, bench,
# the demo's training, the test models) is not in the build context (.dockerignore).
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY calibration_store ./calibration_store
COPY app ./app
COPY clients/python/lad_client ./clients/python/lad_client
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# --- stage 2: runtime ---------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
# cuda | cpu. TORCH_CPU_INDEX_URL is PyTorch's CPU wheel index; point it at a mirror if needed.
ARG TORCH_VARIANT=cuda
ARG TORCH_VERSION=2.13.0
ARG TORCH_CPU_INDEX_URL=https://download.pytorch.org/whl/cpu

LABEL org.opencontainers.image.title="lad-serve" \
      org.opencontainers.image.description="Position-debiased multi-image retrieval with multimodal LLMs (AGD)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.lad-serve.torch-variant="${TORCH_VARIANT}"

# /srv/lad/var: the embedded profile store (LAD_STORE_URL below), the only path the
# service writes. /srv/lad/hf: HF_HOME, where a Hugging Face cache volume is mounted.
# Both are owned by the numeric service user so that new Docker volumes inherit it.
RUN groupadd --gid 10001 lad \
    && useradd --uid 10001 --gid 10001 --no-log-init --create-home --home-dir /home/lad \
       --shell /usr/sbin/nologin lad \
    && mkdir -p /srv/lad/var /srv/lad/hf \
    && chown 10001:10001 /srv/lad/var /srv/lad/hf

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/lad \
    HF_HOME=/srv/lad/hf \
    HF_HUB_OFFLINE=1 \
    HF_HUB_DISABLE_PROGRESS_BARS=1 \
    LAD_HOST=0.0.0.0 \
    LAD_PORT=8000 \
    LAD_STORE_URL=/srv/lad/var/profiles

# Every dependency but torch from the lock file, hash-checked and without resolving
# (scripts/lock writes it; it holds torch's own dependencies too, so the torch install
# below adds only torch and, for CUDA, the CUDA libraries that torch pins exactly).
RUN --mount=type=bind,source=requirements/serve.txt,target=/tmp/requirements/serve.txt \
    pip install --no-cache-dir --require-hashes --no-deps -r /tmp/requirements/serve.txt

# torch apart from the lock: its build differs between the variants.
RUN case "${TORCH_VARIANT}" in \
      cuda) pip install --no-cache-dir "torch==${TORCH_VERSION}" ;; \
      cpu) pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_CPU_INDEX_URL}" ;; \
      *) echo "TORCH_VARIANT must be cuda or cpu, not '${TORCH_VARIANT}'" >&2; exit 1 ;; \
    esac

# The service from the wheel of stage 1 (bind-mounted: BuildKit, the default builder),
# without resolving: its dependencies are all in place, which `pip check` confirms (and
# the import of the OTLP exporter, which the service loads only when tracing is on).
# DL3013 (pin pip versions) is ignored because the argument is a local wheel file, not
# a registry name to pin.
# hadolint ignore=DL3013
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    set -- /wheels/lad_serve-*.whl \
    && pip install --no-cache-dir --no-deps "$1" \
    && pip check \
    && python -c "import torch, redis, app.main, opentelemetry.exporter.otlp.proto.http.trace_exporter; print('torch', torch.__version__)"

WORKDIR /srv/lad
# Numeric user and group, so that Kubernetes' runAsNonRoot can verify them.
USER 10001:10001
EXPOSE 8000
# `lad serve` is PID 1 (exec form, no shell): it receives SIGTERM itself and drains
# in-flight requests for at most LAD_DRAIN_TIMEOUT_S before it exits.
STOPSIGNAL SIGTERM
# Liveness for plain Docker (Kubernetes uses the probes of deploy/k8s/deployment.yaml).
# The start period covers loading a large model; /readyz tells when it can answer retrieve.
HEALTHCHECK --interval=15s --timeout=3s --start-period=300s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('LAD_PORT', '8000'), timeout=2)"]
CMD ["lad", "serve"]
