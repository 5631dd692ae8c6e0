#!/usr/bin/env bash
# docs/cluster.md's figures: the demo bundle on a one-machine Ray cluster, 1 and 2 engine replicas
# (prefix-affinity routing) and 2 with random routing, in interleaved rounds, each measured with
#   xpuspec cluster load --url URL
# Usage: research/bench/cluster_load.sh OUT_DIR [ROUNDS]   (from the repository root, xpuspec[cluster])
set -euo pipefail
out=${1:?output folder}; rounds=${2:-2}
python=${PYTHON:-python}
mkdir -p "$out"
free_port() { "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port); gcs=$(free_port)
# A one-machine cluster: the two commands of the README, with a small object store and no dashboard.
ray start --head --port "$gcs" --num-cpus 4 --include-dashboard=false --object-store-memory 100000000 \
    --disable-usage-stats --block >"$out/ray.log" 2>&1 &
ray_pid=$!
trap 'kill "$ray_pid"; wait "$ray_pid" || true' EXIT
sleep 15
config() {  # replicas policy -> a Serve config for the demo bundle
    "$python" - "$1" "$2" "$port" <<'PY'
import sys, yaml
replicas, policy, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
config = yaml.safe_load(open("deploy/ray/serve_config.yaml"))
config["http_options"] = {"host": "127.0.0.1", "port": port}
app = config["applications"][0]
app["args"]["bundle"] = "demo"
replica = next(d for d in app["deployments"] if d["name"] == "EngineReplica")
replica.pop("autoscaling_config")
replica["num_replicas"] = replicas
replica["ray_actor_options"] = {"num_cpus": 1}
replica["request_router_config"]["request_router_kwargs"]["policy"] = policy
yaml.safe_dump(config, sys.stdout, sort_keys=False)
PY
}
for round in $(seq 1 "$rounds"); do
    for setup in "1 affinity" "2 affinity" "2 random"; do
        set -- $setup
        name="r$1-$2-round$round"
        config "$1" "$2" >"$out/$name.yaml"
        "$python" -m xpuspec.cli cluster up "$out/$name.yaml" --address "127.0.0.1:$gcs" >>"$out/up.log" 2>&1
        sleep 5  # every replica reports before the load starts
        "$python" -m xpuspec.cli cluster load --url "http://127.0.0.1:$port" --clients "${CLIENTS:-1,4,8}" \
            --conversations "${CONVERSATIONS:-8}" --max-tokens "${MAX_TOKENS:-64}" --json "$out/$name.json" | tee "$out/$name.txt"
    done
done
