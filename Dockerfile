# One image for both commands: the chart runs `agent serve` (DaemonSet) and `tracker serve`
# (Deployment) from it, and `agent wait` as an init container.
#
# Base: the tag is pinned; pin its digest too when you publish (docker buildx imagetools inspect
# python:3.11-slim-bookworm) -- it could not be resolved on the offline machine this was written on.
# Builder and final stage must be the same base: the venv's python links to /usr/local/bin/python3.11.

FROM python:3.11-slim-bookworm AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src

# Dependencies first, in their own layer (rebuilt only when the lock changes): exactly the files
# in requirements.lock, each checked against its sha256 (libtorrent is its PyPI manylinux wheel).
# Wheels only: an sdist would be built with whatever its build requirements resolve to today.
# `./dev lock` refreshes the lock files; tests/test_image.py runs these RUN lines (it reads them here).
COPY requirements.lock requirements-build.lock ./
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --require-hashes --only-binary=:all: -r requirements.lock

# Then the project itself, resolving nothing: its wheel is built by the locked setuptools in a
# throwaway venv, installed with --no-deps, and `pip check` fails the build if requirements.lock
# does not satisfy pyproject.toml (a dependency added but not locked).
COPY pyproject.toml README.md ./
COPY agent/ agent/
COPY tracker/ tracker/
COPY clikit/ clikit/
COPY servekit/ servekit/
COPY wirekit/ wirekit/
RUN python -m venv /opt/build \
    && /opt/build/bin/pip install --require-hashes --only-binary=:all: -r requirements-build.lock \
    && /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
    && /opt/venv/bin/pip install --no-deps /wheels/weightswarm-*.whl \
    && /opt/venv/bin/pip check

FROM python:3.11-slim-bookworm

LABEL org.opencontainers.image.title="weightswarm" \
      org.opencontainers.image.description="Peer-to-peer model weights into a Hugging Face hub cache: agent and tracker" \
      org.opencontainers.image.licenses="Apache-2.0"

# No build tools here: only the finished venv comes over.
COPY --from=builder /opt/venv /opt/venv

# uid/gid 10001 matches the chart's runAsUser/runAsGroup defaults; no login shell, no home files.
RUN groupadd --system --gid 10001 weightswarm \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin weightswarm

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

USER 10001:10001
WORKDIR /tmp
EXPOSE 6881/tcp 6881/udp 7470/tcp 8080/tcp

# No ENTRYPOINT: the chart chooses `agent ...` or `tracker ...` as the command.
CMD ["agent", "serve"]
