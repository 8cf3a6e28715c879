#!/bin/sh
# Runs COMMAND with VAR=VALUE set on rank RANK only (ferryrun's FERRY_RANK): for jobs whose ranks
# are configured differently.
#   rank_env.sh RANK VAR=VALUE COMMAND...
rank=$1 setting=$2
shift 2
if [ "${FERRY_RANK:-}" = "$rank" ]; then export "${setting?}"; fi
exec "$@"
