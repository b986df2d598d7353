#!/usr/bin/env bash
# Stops the test services started by scripts/services/up.sh (by their pid files).
#   scripts/services/down.sh          stop Kafka and Redis, keep Kafka's data and jars
#   scripts/services/down.sh --wipe   also delete Kafka's data (topics); the jars stay cached
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

case "${1:-}" in
  "") kafka_cmd=stop ;;
  --wipe) kafka_cmd=wipe ;;
  *)
    echo "usage: $0 [--wipe]" >&2
    exit 2
    ;;
esac

rc=0
bash "$HERE/kafka.sh" "$kafka_cmd" || rc=1
bash "$HERE/redis.sh" stop || rc=1
exit "$rc"
