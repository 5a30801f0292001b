# cdc-agent as a container: the command line (demo, log tools, tail) with every sink's
# driver installed. Build: docker build -t cdc-agent .   Run: docker run --rm cdc-agent demo
FROM python:3.11-slim

# Nothing runs as root inside; logs and local wal3 logs go under /var/lib/cdc-agent.
RUN useradd --system --create-home --home-dir /var/lib/cdc-agent cdc
WORKDIR /opt/cdc-agent
COPY pyproject.toml README.md ./
COPY sequencer ./sequencer
COPY agent ./agent
COPY sinks ./sinks
COPY replay ./replay
RUN pip install --no-cache-dir '.[all]'

USER cdc
WORKDIR /var/lib/cdc-agent
ENTRYPOINT ["cdc-agent"]
CMD ["demo"]
