#!/usr/bin/env bash
# A class's waves on the lent GPU machine (issue 48; bench/README.md, "A class at 1.0×, 2× and 4×"): the study's
# PyTorch class through study/harness.py, one arm after another inside one time budget, every run kept.
#   ARMS="cold:2 before:2 warm:2 warm:1" LIMIT=565 bash bench/gpu/class_waves.sh     (carry .whl, bench/gpu/before)
# An arm is warm (32 warm kernels that imported PyTorch), cold (none), before (the code of issue 48's baseline) or
# then (an earlier commit of today's layout, warm as the warm arm: a change's before and after in one call), then ':'
# and the class's size in cards' worth of jobs (FACTOR, default 2), and optionally ':' and the client's connections
# (default 6, a browser's; e.g. warm:2:44 gives each student a connection of their own). An arm that cannot finish in
# the time left (under MIN seconds, default 140) is skipped and said. The code before and then are copies of their sources:
#   mkdir -p bench/gpu/before && git archive d9100ab jupyter_gpushare bench/study jupyter-config | tar -x -C bench/gpu/before
#   mkdir -p bench/gpu/then && git archive COMMIT jupyter_gpushare bench/study bench/_kernels.py jupyter-config \
#     | tar -x -C bench/gpu/then
# Everything lands in $OUT/s, packed as $OUT/study.tgz.
set -u
source bench/gpu/device_env.sh || exit 1
export JUPYTER_DATA_DIR=$(mktemp -d) JUPYTER_RUNTIME_DIR=$(mktemp -d)
mkdir -p $OUT/s
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/s/gpu.txt
date -u > $OUT/s/date.txt
end=$(( $(date +%s) + ${LIMIT:-560} ))
i=0
for spec in ${ARMS:-warm cold cold warm}; do
  i=$((i+1)); IFS=: read -r arm factor conns <<< "$spec"; factor=${factor:-${FACTOR:-2}}; conns=${conns:-6}
  left=$(( end - $(date +%s) )); name=$arm-x$factor-c$conns-$i
  [ $left -lt ${MIN:-140} ] && { echo "skip $name: ${left}s left"; continue; }
  run="--out $OUT/s/$name --runs torch:gpushare:$factor --reruns 1 --workdir /tmp --connections $conns"
  case $arm in
    warm) timeout $(( left - 5 )) python3 bench/study/harness.py $run --warm 32 --warm-imports torch ;;
    cold) timeout $(( left - 5 )) python3 bench/study/harness.py $run ;;
    before)  # its own provisioner entry point first (before the folders, it lived at jupyter_gpushare.provisioner)
      d=/tmp/site-before/jupyter_gpushare-0.1.0.dist-info; mkdir -p $d
      printf 'Metadata-Version: 2.1\nName: jupyter-gpushare\nVersion: 0.1.0\n' > $d/METADATA
      printf '[jupyter_client.kernel_provisioners]\ngpushare-provisioner = jupyter_gpushare.provisioner:GpuShareProvisioner\n' > $d/entry_points.txt
      (cd bench/gpu/before && PYTHONPATH=$PWD:/tmp/site-before:/tmp/site timeout $(( left - 5 )) python3 bench/study/harness.py $run) ;;
    then)  # today's entry point (device_env.sh), the earlier commit's sources first on the path
      (cd bench/gpu/then && PYTHONPATH=$PWD:/tmp/site timeout $(( left - 5 )) python3 bench/study/harness.py $run --warm 32 --warm-imports torch) ;;
    *) echo "unknown arm $arm: warm, cold, before or then"; continue ;;
  esac > $OUT/s/$name.log 2>&1
  echo "$name rc=$? $(date -u +%T)"
  python3 bench/study/waves.py $OUT/s/$name/results.json
done
cd $OUT && tar czf study.tgz s
