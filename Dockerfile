# syntax=docker/dockerfile:1
# The single gpuop image: the operator (`gpuop run`) and the node agent
# (`gpuop node-agent ...`, run by the validator and exporters on every GPU node).
#
#   docker build -t ghcr.io/gpuop/gpuop:0.1.0 .
#   docker run --rm ghcr.io/gpuop/gpuop:0.1.0 version
#
# Build stage: a virtual environment with gpuop and its dependencies, from wheels.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/gpuop
COPY pyproject.toml README.md ./
COPY gpuop ./gpuop
COPY statemachine ./statemachine
COPY components ./components
COPY crd ./crd
# Our own wheel first (setuptools, pure Python), then it and its dependencies from
# binary wheels only: a dependency that needed a compiler fails the build here
# rather than pulling build tools in.
RUN /opt/gpuop/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/gpuop/bin/pip install --only-binary=:all: /wheels/gpuop-*.whl
# The version is baked into the installed package's metadata (`gpuop version`);
# the development wing, gpuop/devcluster, stayed out (.dockerignore); compile bytecode now,
# since the root filesystem is read-only at run time.
RUN /opt/gpuop/bin/gpuop version \
 && /opt/gpuop/bin/python -I -c 'import importlib.util as u, sys; \
      sys.exit(u.find_spec("gpuop.devcluster") is not None)' \
 && /opt/gpuop/bin/python -m compileall -q /opt/gpuop/lib \
 && /opt/gpuop/bin/pip uninstall -y pip

# Final stage: the interpreter, the environment, nothing to build with.
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="gpuop" \
      org.opencontainers.image.description="A GPU operator for Kubernetes, written in Python" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/gpuop/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/gpuop /opt/gpuop
# A fixed unprivileged user (the chart runs as 65532 with a read-only root).
RUN groupadd --system --gid 65532 gpuop \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin gpuop
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["gpuop"]
CMD ["run"]
