# syntax=docker/dockerfile:1
# The bridge image: one image for every command (`serve`, `workers --pack NAME`, `verify`, ...).
#
#   docker build -t mcp-kafka-bridge:0.2.0 .
#
# Stage 1 builds the package into a virtualenv; stage 2 copies only that virtualenv onto a
# clean base and runs it as an unprivileged user. Kubernetes runs it with a read-only root
# filesystem (k8s/): nothing here writes outside /tmp at run time.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/bridge
# The Avro schema lives in schemas/ at the repository root; bridge/schemas is a symlink to it and
# is packaged as package data, so the installed package finds it (bridge/envelope.py
# _schema_dirs looks in <site-packages>/bridge/schemas). Copy both: the symlink must resolve.
COPY pyproject.toml README.md ./
COPY schemas/ schemas/
COPY bridge/ bridge/
RUN /opt/bridge/bin/pip install .

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="mcp-kafka-bridge" \
      org.opencontainers.image.description="Kafka-backed MCP server with resumable task event streams (SEP-2694)" \
      org.opencontainers.image.licenses="Apache-2.0"
# A fixed numeric uid/gid, so Kubernetes' runAsNonRoot can verify it without /etc/passwd.
RUN groupadd --system --gid 10001 bridge \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin bridge
COPY --from=build /opt/bridge /opt/bridge
# pip compiled the bytecode at install time; the root filesystem is read-only in Kubernetes.
# HOME=/tmp: the only writable place (an emptyDir in k8s/). The server listens on the
# container's address, so `bridge serve` refuses to start without caller authentication
# (BRIDGE_AUTH__MODE=jwt|bearer and its settings) unless BRIDGE_AUTH__ALLOW_UNAUTHENTICATED=true
# says that a gateway in front authenticates (docs/deployment.md, "Defaults").
ENV PATH=/opt/bridge/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    BRIDGE_SERVER__HOST=0.0.0.0 \
    BRIDGE_SERVER__PORT=8080
# Fail the build if the installed package cannot find its Avro schema.
RUN python -c "from bridge.envelope import encode_event, TaskEvent; encode_event(TaskEvent('a.b.c', {}))"
# The image is the runtime only: fail the build if development tooling got in (the development
# package with the local Kafka, the demo and `bridge replay`, or trustme; docs/development.md).
RUN python -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) for m in ('bridgedev', 'trustme')))"
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080
# No HEALTHCHECK: the same image runs `bridge workers` and `bridge verify`, which serve no HTTP;
# Kubernetes probes /healthz and /readyz of `bridge serve` (k8s/base/server/statefulset.yaml).
ENTRYPOINT ["bridge"]
CMD ["serve"]
