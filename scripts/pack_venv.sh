#!/usr/bin/env bash
# Pack ktm and its Python dependencies into a relocatable virtualenv archive for Spark executors.
#
#   scripts/pack_venv.sh [OUTPUT]          # OUTPUT defaults to ktm-env.tar.gz
#
# Builds a fresh venv (a normal, non-editable `pip install` of this checkout plus venv-pack) in a
# temporary directory, packs it with venv-pack and removes the venv. The archive leaves out
# pyspark's jars (~450 MB): executors already run Spark's own JVM, and the Python side of pyspark
# needs none of them. Set KTM_PACK_KEEP_JARS=1 to keep them.
#
# venv-pack does not copy the Python interpreter: bin/python in the archive is a symlink to the
# interpreter that built it ($PYTHON, default python3). Every worker must have that same Python
# version at that same absolute path.
set -euo pipefail

output=${1:-ktm-env.tar.gz}
python=${PYTHON:-python3}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

case "$output" in
    /*) ;;
    *) output="$PWD/$output" ;;
esac

venv=$(mktemp -d "${TMPDIR:-/tmp}/ktm-packenv.XXXXXX")
trap 'rm -rf "$venv"' EXIT

start=$SECONDS
echo "building venv in $venv with $("$python" -c 'import sys; print(sys.executable, sys.version.split()[0])')" >&2
"$python" -m venv "$venv"
"$venv/bin/pip" install --quiet "$repo" venv-pack

exclude=()
if [[ "${KTM_PACK_KEEP_JARS:-0}" != "1" ]]; then
    exclude=(--exclude 'lib/python*/site-packages/pyspark/jars/*')
fi
"$venv/bin/venv-pack" --quiet --force -p "$venv" -o "$output" "${exclude[@]}"

echo "packed $output ($(du -h "$output" | cut -f1)) in $((SECONDS - start))s" >&2
cat <<EOF

# In the ktm config:
[spark.conf]
"spark.archives" = "$output#environment"
"spark.pyspark.python" = "./environment/bin/python"
# (ktm passes spark.pyspark.python to PySpark as PYSPARK_PYTHON on a cluster master; a
# PYSPARK_PYTHON already set in ktm's environment wins.)
EOF
