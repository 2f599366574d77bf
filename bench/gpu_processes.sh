#!/usr/bin/env bash
# Real-GPU process listing: start a PyTorch training loop, an inference loop and two
# anonymous workers in the background, then list and classify the GPU's processes
# (`python -m services.collector.processes`) a few times. Writes under ${OUT:-/tmp}/h19.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
dest="${OUT:-/tmp}/h19"
mkdir -p "$dest"
PY=${PYTHON:-python3}
pids=()
$PY bench/gpu_workloads/train_loop.py 150 >"$dest/train.log" 2>&1 & pids+=($!)
$PY bench/gpu_workloads/infer_loop.py 150 >"$dest/infer.log" 2>&1 & pids+=($!)
$PY bench/gpu_workloads/worker.py burn 10 150 >"$dest/burn.log" 2>&1 & pids+=($!)
$PY bench/gpu_workloads/worker.py hold 6 150 >"$dest/hold.log" 2>&1 & pids+=($!)
echo "workload pids: ${pids[*]}"
for _ in $(seq 90); do
  n=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | wc -l)
  [ "$n" -ge 4 ] && break
  sleep 1
done
sleep 8  # let NVML gather per-process utilisation samples
for i in 1 2 3; do
  $PY -m services.collector.processes >"$dest/listing-$i.jsonl" 2>"$dest/listing-$i.err"
  echo "listing $i: rc=$? $(wc -l <"$dest/listing-$i.jsonl") GPU line(s)"
  sleep 6
done
nvidia-smi >"$dest/nvidia-smi.txt" 2>&1
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv >>"$dest/nvidia-smi.txt" 2>&1
kill "${pids[@]}" 2>/dev/null
wait 2>/dev/null
$PY - "$dest"/listing-*.jsonl <<'PYEOF'
import json, sys
for path in sys.argv[1:]:
    print(f"== {path.rsplit('/', 1)[-1]}")
    for line in open(path):
        gpu = json.loads(line)
        print(f"{gpu['gpu_uuid']} index {gpu['gpu_index']}: {len(gpu['processes'])} process(es)")
        for p in gpu["processes"]:
            print(f"  pid {p['pid']:>7} {p['type']:<8} mem {p['used_memory_mib']} MiB sm {p['sm_util_pct']}%"
                  f" mem-util {p['mem_util_pct']}% user {p['user']} -> {p['classification']} [{p['rule']}]"
                  f" | {(p['command_line'] or '')[:90]}")
PYEOF
