# cdc-agent as a container. By default it runs the sidecar: the capture core on the Unix
# socket /run/cdc-agent/cdc-agent.sock (share /run/cdc-agent with the application's
# container), shipping to a wal3 log under the volume /var/lib/cdc-agent
# (config/sidecar.toml; override keys with CDC_AGENT_* variables, docs/configuration.md).
#   docker build -t cdc-agent .
#   docker run -v cdc-log:/var/lib/cdc-agent -v cdc-run:/run/cdc-agent cdc-agent
#   docker run --rm cdc-agent demo --log memory://       # any other subcommand
# Versions are pinned: the base image's tag and docker/constraints.txt.
FROM python:3.11.7-slim-bookworm

# Nothing runs as root inside: the user cdc owns the log volume and the socket folder.
RUN useradd --system --uid 10001 --user-group --no-create-home \
        --home-dir /var/lib/cdc-agent cdc \
    && mkdir -p /var/lib/cdc-agent/log /run/cdc-agent \
    && chown -R cdc:cdc /var/lib/cdc-agent /run/cdc-agent
WORKDIR /opt/cdc-agent
COPY pyproject.toml setup.py README.md ./
COPY docker/constraints.txt ./docker/constraints.txt
COPY sequencer ./sequencer
COPY agent ./agent
COPY sinks ./sinks
COPY replay ./replay
# gcc builds the C sequencer (sequencer._native) and leaves again in the same layer; the
# import check fails the build rather than ship the slower pure-Python fallback.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install --no-cache-dir -c docker/constraints.txt '.[all]' \
    && python -c "import sequencer._native" \
    && apt-get purge -y --auto-remove gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY config /etc/cdc-agent

USER cdc
WORKDIR /var/lib/cdc-agent
VOLUME ["/var/lib/cdc-agent", "/run/cdc-agent"]
# The sidecar answers on its socket once it accepts batches (cdc-agent health).
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["cdc-agent", "health", "--socket", "/run/cdc-agent/cdc-agent.sock"]
ENTRYPOINT ["cdc-agent"]
CMD ["sidecar", "--socket", "/run/cdc-agent/cdc-agent.sock", "--config", "/etc/cdc-agent/sidecar.toml"]
