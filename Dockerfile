# One image for the web server and the workers (docker-compose.yml picks the command).
# CPU by default; the GPU worker service runs the same image under the NVIDIA runtime
# (torch's default Linux wheel from PyPI bundles CUDA; vLLM/DeepSpeed via the `gpu` extra).
FROM python:3.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DS_BUILD_OPS=0 \
    TORCH_EXTENSIONS_DIR=/home/inflight/.cache/inflight/torch_extensions

RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
ARG INSTALL_EXTRAS=""
RUN pip install torch==2.13.0
COPY pyproject.toml README.md ./
COPY rl_core ./rl_core
COPY workers ./workers
COPY platform ./platform
RUN pip install -e ".${INSTALL_EXTRAS}"
COPY . .
RUN python manage.py collectstatic --noinput
# The web server and the workers (and so every run's engine) run as an unprivileged user that
# owns only the data folders; the volumes mounted there start with this ownership.
RUN useradd --create-home --uid 1000 inflight \
    && mkdir -p /data/runs /data/models /data/shared \
    && chown -R inflight:inflight /data /home/inflight
USER inflight

EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "inflight.asgi:application"]
