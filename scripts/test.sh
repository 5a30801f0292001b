#!/usr/bin/env bash
# Install everything the test suite needs, then run it. Services (PostgreSQL, Kafka,
# the S3 server) are started by the test fixtures on free loopback ports and stopped
# by PID; this script only makes sure their software is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

python3 -m pip install -q -e '.[all,test]'
for installer in scripts/install-*.sh; do
  [ -e "$installer" ] || continue
  echo "== $installer"
  bash "$installer"
done
python3 -m pytest "$@"
