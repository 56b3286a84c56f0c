# Two images from one file:
#   docker build --target serve -t pixpool-serve .   the daemon: prepare, serve, status, clean (no torch)
#   docker build --target train -t pixpool-train .   trainers: pixpool[train] with torch (CPU build by default)
#   docker build --target train --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 -t pixpool-train:cu128 .
# Both run as the same user (uid 1000): the socket directory is 0700 and every segment is
# checked to belong to the uid its name carries, so a daemon and its trainers must agree.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS base
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
ARG PIXPOOL_UID=1000
RUN useradd --uid ${PIXPOOL_UID} --create-home --shell /usr/sbin/nologin pixpool \
 && install -d -m 0700 -o pixpool -g pixpool /run/pixpool \
 && install -d -m 0755 -o pixpool -g pixpool /home/pixpool/runs
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY shared shared
COPY server server
COPY client client
COPY integrations integrations
COPY cli cli
COPY ops ops

# The serving image: the package and its core dependencies only (numpy, OpenCV, pyzmq, ...).
FROM base AS serve
RUN pip install . && rm -rf /src
USER pixpool
WORKDIR /home/pixpool
# The socket directory trainers mount; 0700 and owned by pixpool (a named volume copies this).
VOLUME ["/run/pixpool"]
EXPOSE 9310
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=600s --retries=3 CMD ["pixpool", "status", "--probe", "--socket-dir", "/run/pixpool", "--timeout-s", "2"]
CMD ["pixpool", "serve", "/data/data.yaml", "--socket-dir", "/run/pixpool"]

# The trainer image: torch first from its own index (CPU wheels unless told otherwise), then pixpool[train].
FROM base AS train
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install --index-url ${TORCH_INDEX_URL} torch==${TORCH_VERSION} \
 && pip install ".[train]" && rm -rf /src
COPY examples /opt/pixpool/examples
USER pixpool
WORKDIR /home/pixpool
CMD ["torchrun", "--nproc-per-node", "1", "/opt/pixpool/examples/torchrun_ddp.py", "--socket-dir", "/run/pixpool"]
