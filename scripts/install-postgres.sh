#!/usr/bin/env bash
# Make sure PostgreSQL's server binaries (initdb, pg_ctl, postgres) are installed.
# The test fixture (tests/services/postgres.py) runs its own throwaway cluster from
# them; this script never starts or configures a server. Idempotent and
# non-interactive: it does nothing when the binaries are already there.
set -euo pipefail

have_server() {
  command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1 && return 0
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null 2>&1 && return 0
  return 1
}

if have_server; then
  echo "postgresql: server binaries present, nothing to install"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo -n"
else
  SUDO=""
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q </dev/null
$SUDO apt-get install -y -q --no-install-recommends postgresql </dev/null

if ! have_server; then
  echo "postgresql: apt-get finished but initdb/pg_ctl are still missing" >&2
  exit 1
fi
echo "postgresql: installed $(compgen -G '/usr/lib/postgresql/*/bin/initdb' | head -n1)"
