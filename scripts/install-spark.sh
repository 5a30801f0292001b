#!/usr/bin/env bash
# Install PySpark (the `spark` extra's pins, when missing: the extra is not in `all`, so
# the runtime image stays without Spark), then fetch the connector jars replay.spark
# uses with PySpark 4.1.1 (Delta Lake output, the Kafka source) from Maven Central into
# .cache/spark/jars (ignored by git). Jars PySpark already ships (Scala, Hadoop,
# Parquet, logging...) are removed from the cache so no class is loaded twice.
#
# Idempotent: does nothing when the jars of the pinned versions are already there.
# Non-interactive (mvn -B, no stdin); works as root and with CI=true.
set -euo pipefail
cd "$(dirname "$0")/.."

# Keep in step with [project.optional-dependencies] spark in pyproject.toml.
if ! python3 -c 'import pyspark, pandas' >/dev/null 2>&1; then
  python3 -m pip install -q 'pyspark==4.1.1' 'pandas>=2.2,<3'
fi

pom=scripts/spark/pom.xml
jars=.cache/spark/jars
spark=$(sed -n 's:.*<spark.version>\(.*\)</spark.version>.*:\1:p' "$pom")
delta=$(sed -n 's:.*<delta.version>\(.*\)</delta.version>.*:\1:p' "$pom")
stamp="$jars/.complete-$spark-$delta"

if [ -e "$stamp" ]; then
  echo "spark connectors ($spark, delta $delta): jars already in $jars"
  exit 0
fi
if ! command -v mvn >/dev/null 2>&1 || ! command -v java >/dev/null 2>&1; then
  echo "install-spark.sh: needs 'java' (17+) and 'mvn' on PATH" >&2
  exit 1
fi
shipped=$(python3 -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))') || {
  echo "install-spark.sh: pyspark is not installed; run: python3 -m pip install '.[spark]'" >&2
  exit 1
}

rm -rf "$jars"
mkdir -p "$jars"
mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies \
  -DincludeScope=runtime -DoutputDirectory="$PWD/$jars" </dev/null
artifact() { basename "$1" | sed -E 's/-[0-9].*\.jar$//'; }
declare -A have=()
for jar in "$shipped"/*.jar; do have[$(artifact "$jar")]=1; done
for jar in "$jars"/*.jar; do
  if [ -n "${have[$(artifact "$jar")]:-}" ]; then rm -f "$jar"; fi
done
for needed in "delta-spark_4.1_2.13-$delta.jar" "spark-sql-kafka-0-10_2.13-$spark.jar"; do
  if [ ! -e "$jars/$needed" ]; then
    echo "install-spark.sh: maven finished but $jars/$needed is missing" >&2
    exit 1
  fi
done
touch "$stamp"
echo "spark connectors ($spark, delta $delta): $(ls "$jars"/*.jar | wc -l) jars in $jars"
