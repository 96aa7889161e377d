# Service image. PyPI's torch wheel for Linux is the CUDA build, which is what a GPU
# node wants; for a CPU-only image pass --build-arg TORCH_INDEX_URL=<your CPU wheel index>.
FROM python:3.11-slim AS runtime

ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX_URL=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    HF_HUB_OFFLINE=1 \
    LAD_HOST=0.0.0.0 \
    LAD_PORT=8000 \
    LAD_STORE_URL=/srv/lad/var/profiles

RUN useradd --create-home --uid 10001 lad
WORKDIR /srv/lad

RUN if [ -n "$TORCH_INDEX_URL" ]; then \
        pip install "$TORCH_SPEC" --index-url "$TORCH_INDEX_URL"; \
    else \
        pip install "$TORCH_SPEC"; \
    fi

COPY pyproject.toml README.md ./
COPY app ./app
COPY calibration_store ./calibration_store
RUN pip install ".[redis]" && mkdir -p /srv/lad/var && chown lad /srv/lad/var

USER lad
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=60s \
    CMD python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)" || exit 1
CMD ["sh", "-c", "lad serve --host \"$LAD_HOST\" --port \"$LAD_PORT\""]
