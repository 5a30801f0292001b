#!/usr/bin/env bash
# Fetch the class path of a pinned Apache Kafka broker (KRaft) from Maven Central into
# .cache/kafka/libs (ignored by git). The test fixture (tests/services/kafka.py) and the
# benchmark run the broker from these jars; no Docker, no other download.
#
# Idempotent: does nothing when the jars of the pinned version are already there.
# Non-interactive (mvn -B, no stdin); works as root and with CI=true.
set -euo pipefail
cd "$(dirname "$0")/.."

pom=scripts/kafka/pom.xml
libs=.cache/kafka/libs
version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom")
stamp="$libs/.complete-$version"

if [ -e "$stamp" ]; then
  echo "kafka $version: jars already in $libs"
  exit 0
fi
if ! command -v mvn >/dev/null 2>&1 || ! command -v java >/dev/null 2>&1; then
  echo "install-kafka.sh: needs 'java' (17+) and 'mvn' on PATH" >&2
  exit 1
fi

rm -rf "$libs"
mkdir -p "$libs"
mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies \
  -DincludeScope=runtime -DoutputDirectory="$PWD/$libs" </dev/null
if [ ! -e "$libs/kafka_2.13-$version.jar" ]; then
  echo "install-kafka.sh: maven finished but $libs/kafka_2.13-$version.jar is missing" >&2
  exit 1
fi
touch "$stamp"
echo "kafka $version: $(ls "$libs"/*.jar | wc -l) jars in $libs"
