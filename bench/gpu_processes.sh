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
# one-shot listings (each looks back 10 s), then one long-lived source polling every 5 s,
# as the collector does (utilisation = mean over the samples since the previous poll)
for i in 1 2; do
  $PY -m services.collector.processes >"$dest/listing-$i.jsonl" 2>"$dest/listing-$i.err"
  echo "listing $i: rc=$? $(wc -l <"$dest/listing-$i.jsonl") GPU line(s)"
done
$PY -m services.collector.processes --count 4 --interval 5 >"$dest/listing-3-polled.jsonl" 2>"$dest/listing-3.err"
echo "polled listing: rc=$? $(wc -l <"$dest/listing-3-polled.jsonl") GPU line(s)"
nvidia-smi >"$dest/nvidia-smi.txt" 2>&1
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv >>"$dest/nvidia-smi.txt" 2>&1
kill "${pids[@]}" 2>/dev/null
wait 2>/dev/null
# the proxy's added latency on an otherwise idle 16-core machine (no GPU involved)
timeout 120 $PY bench/bench_llm_proxy.py 2>&1 | tee "$dest/bench_llm_proxy.txt"
$PY - "$dest"/listing-*.jsonl <<'PYEOF'
import json, sys
for path in sys.argv[1:]:
    print(f"== {path.rsplit('/', 1)[-1]}")
    for n, line in enumerate(open(path)):
        gpu = json.loads(line)
        print(f"[poll {n + 1}] {gpu['gpu_uuid']} index {gpu['gpu_index']}: {len(gpu['processes'])} process(es)")
        for p in gpu["processes"]:
            print(f"  pid {p['pid']:>7} {p['type']:<8} mem {p['used_memory_mib']} MiB sm {p['sm_util_pct']}%"
                  f" mem-util {p['mem_util_pct']}% user {p['user']} -> {p['classification']} [{p['rule']}]"
                  f" | {(p['command_line'] or '')[:90]}")
PYEOF
