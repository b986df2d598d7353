#!/usr/bin/env bash
# Installs (first time) and starts the real test services: Kafka 4.x (KRaft) and Redis.
# Idempotent: services that already answer are left alone. Both start in parallel.
#   Kafka: 127.0.0.1:${FLEETPLAN_KAFKA_PORT:-19092}   Redis: 127.0.0.1:${FLEETPLAN_REDIS_PORT:-16379}
# Stop them with scripts/services/down.sh.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
t0=$SECONDS

bash "$HERE/kafka.sh" start &
kafka_job=$!
bash "$HERE/redis.sh" start &
redis_job=$!

failed=()
wait "$kafka_job" || failed+=(kafka)
wait "$redis_job" || failed+=(redis)

if ((${#failed[@]})); then
  printf '[services] ERROR: failed to start: %s (see the messages above)\n' "${failed[*]}" >&2
  exit 1
fi
printf '[services] up in %d s: FLEETPLAN_KAFKA_BOOTSTRAP=127.0.0.1:%s FLEETPLAN_REDIS_URL=redis://127.0.0.1:%s/0\n' \
  $((SECONDS - t0)) "${FLEETPLAN_KAFKA_PORT:-19092}" "${FLEETPLAN_REDIS_PORT:-16379}" >&2
